"""Run every benchmark in bench/ (``make bench``), one after the other, and say how each ran.

Each ``bench/bench_*.py`` runs as its own process with its default arguments (the sizes its
docstring and bench/RESULTS.md quote). Its output goes to ``bench/out/<name>.log``; the run's
summary, one row per benchmark with the date, the commit, the load average before and after
(the machine may be shared: a busy one skews absolute times, so read the ratios) and the exit
status, goes to ``bench/out/run_all.md`` and to stdout. A benchmark that fails does not stop the
others; the exit status is 1 if any failed.

Run: .venv/bin/python bench/run_all.py [--only turn,sessions] [--list]
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
OUT = BENCH / "out"


def benchmarks() -> list[str]:
    """Every benchmark's short name (``bench_turn.py`` -> ``turn``), sorted."""
    return sorted(p.stem.removeprefix("bench_") for p in BENCH.glob("bench_*.py"))


def commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty.strip() else "")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run(name: str) -> tuple[str, str, str, str, float, int]:
    """Run one benchmark: (name, started UTC, load before, load after, seconds, exit code)."""
    OUT.mkdir(exist_ok=True)
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    before = load()
    clock = time.monotonic()
    with (OUT / f"{name}.log").open("w") as log:
        code = subprocess.run([sys.executable, str(BENCH / f"bench_{name}.py")], cwd=ROOT,
                              stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    return name, started, before, load(), time.monotonic() - clock, code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated names (default: every benchmark)")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args()
    names = benchmarks()
    if args.list:
        print("\n".join(names))
        return 0
    if args.only:
        chosen = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(chosen) - set(names))
        if unknown:
            parser.error(f"no such benchmark: {', '.join(unknown)} (have: {', '.join(names)})")
        names = chosen
    head = commit()
    rows = ["| benchmark | started | commit | load before | load after | seconds | status |",
            "|---|---|---|---|---|---|---|"]
    failed = 0
    for name in names:
        print(f"running bench_{name}.py ...", flush=True)
        name, started, before, after, seconds, code = run(name)
        failed += code != 0
        status = "ok" if code == 0 else f"FAILED ({code}; see bench/out/{name}.log)"
        rows.append(f"| {name} | {started} | {head} | {before} | {after} | {seconds:.0f} | "
                    f"{status} |")
        print(rows[-1], flush=True)
    report = "\n".join(["# Benchmark runs", "", *rows, ""])
    (OUT / "run_all.md").write_text(report)
    print(report)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
