"""Paired before/after of one scenario of the Telegram or Slack benchmark, from two checkouts.

    .venv/bin/python bench/ab_trees.py BEFORE_TREE AFTER_TREE {telegram|slack} {a|b} RUNS

Each tree is a checkout with its own ``.venv`` (``make lint`` makes one). Every run is the
benchmark's own ``run_one`` for the gateway subject in a fresh process of that tree's venv,
the two trees alternating with the order flipped every run, so both see the same minutes of
this shared machine. Prints each run, then medians and the median of the paired ratios
(after / before) of CPU per message, p50 latency and messages per second.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

SNIPPET = r'''
import asyncio, json, sys
sys.path[:0] = ["bench", "."]
import bench_{bench} as b
scenario = next(s for s in b.SCENARIOS if s.name == "{scenario}")
options = {{"poll_timeout": 10}} if "{bench}" == "telegram" else {{}}
run = asyncio.run(b.run_one("gateway", scenario, 0, **options))
print("RESULT " + json.dumps({{"cpu_ms": run.cpu_ms, "p50_ms": run.p50 * 1000,
                               "rate": run.rate, "rss_mib": run.peak_rss / 2**20}}))
'''


def one(tree: str, bench: str, scenario: str) -> dict[str, float]:
    code = SNIPPET.format(bench=bench, scenario=scenario)
    done = subprocess.run([f"{tree}/.venv/bin/python", "-c", code], cwd=tree,
                          capture_output=True, text=True, timeout=600, check=False)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, float] = json.loads(line.removeprefix("RESULT "))
            return result
    raise SystemExit(f"{tree}: no result\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")


def main() -> None:
    before, after, bench, scenario, runs = sys.argv[1:6]
    results: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for i in range(int(runs)):
        order = [("before", before), ("after", after)]
        for name, tree in order if i % 2 == 0 else order[::-1]:
            result = one(tree, bench, scenario)
            results[name].append(result)
            print(i, name, {k: round(v, 2) for k, v in result.items()},
                  "load", os.getloadavg()[0], flush=True)
    for key in ("cpu_ms", "p50_ms", "rate"):
        old = [r[key] for r in results["before"]]
        new = [r[key] for r in results["after"]]
        ratios = [n / o for n, o in zip(new, old, strict=True)]
        print(f"{key}: before {statistics.median(old):.2f} after {statistics.median(new):.2f}"
              f" paired ratio {statistics.median(ratios):.3f}"
              f" (range {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
