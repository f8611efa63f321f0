"""How long the ``gateway`` console script takes to answer ``--version``, ``--help``, every
command's ``--help`` and a shell's completion request (Tab), against a floor measured in the
same run: the same interpreter starting and exiting (``python -c pass``) and importing
argparse and argcomplete, which any argcomplete-driven CLI pays.

Each case runs ``--rounds`` times as a fresh process (the console script of this venv, as a
person's shell runs it); the report gives the median and the spread in milliseconds, the
ratio to the floor, and whether the median is under the target (0.3 s, the issue's figure).
The slowest modules of one ``python -X importtime`` run of ``--version`` follow, so a heavy
import that creeps back is named.

With ``--baseline DIR`` (a checkout of another commit, e.g. ``git worktree add --detach
/tmp/base <commit>``), ``--version``, ``--help`` and one completion are also timed as
``python -m gateway`` run from DIR (its modules shadow the installed ones), paired in the same
run: the ratio is this tree's median over the baseline's.

Run: .venv/bin/python bench/bench_cli_startup.py [--rounds 15] [--baseline DIR]
Report: bench/out/cli_startup.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
TARGET_S = 0.3
COMMANDS = ("run", "chat", "replay", "drift", "export", "usage", "sessions", "viewer", "db",
            "pairing", "memory", "forget", "schedule", "tools", "completion")


def completing(line: str) -> dict[str, str]:
    """The environment a shell sets when it asks argcomplete to complete ``line``."""
    return {"_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
            "COMP_TYPE": "9", "_ARGCOMPLETE_IFS": "\v",
            "_ARGCOMPLETE_STDOUT_FILENAME": os.devnull}


def timed(argv: list[str], extra_env: dict[str, str], rounds: int,
          cwd: Path = ROOT) -> list[float]:
    env = {**os.environ, **extra_env}
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False, cwd=cwd, timeout=60)
        times.append(time.perf_counter() - start)
    return times


def slowest_imports(script: Path, n: int = 8) -> list[tuple[int, str]]:
    done = subprocess.run([sys.executable, "-X", "importtime", str(script), "--version"],
                          capture_output=True, text=True, check=False, cwd=ROOT)
    rows = []
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].rstrip()))
    return sorted(rows, reverse=True)[:n]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a checkout of another commit to pair --version/--help/Tab with")
    args = parser.parse_args()
    script = Path(sys.executable).with_name("gateway")
    python = sys.executable
    cases: list[tuple[str, list[str], dict[str, str]]] = [
        ("floor: python -c pass", [python, "-c", "pass"], {}),
        ("floor: import argparse, argcomplete", [python, "-c", "import argparse, argcomplete"],
         {}),
        ("gateway --version", [str(script), "--version"], {}),
        ("gateway --help", [str(script), "--help"], {}),
        ("Tab: gateway re", [str(script)], completing("gateway re")),
        ("Tab: gateway replay --", [str(script)], completing("gateway replay --")),
        ("Tab: gateway export --format ", [str(script)], completing("gateway export --format ")),
        *((f"gateway {name} --help", [str(script), name, "--help"], {}) for name in COMMANDS),
    ]
    rows = []
    floor = None
    for label, argv, env in cases:
        times = timed(argv, env, args.rounds)
        median = statistics.median(times)
        if floor is None:
            floor = median
        rows.append((label, median, min(times), max(times), median / floor))
        print(f"{label:40s} {median * 1000:7.1f} ms", flush=True)
    paired = []
    if args.baseline is not None:
        here = [python, "-m", "gateway"]
        for label, extra, env in (("--version", ["--version"], {}), ("--help", ["--help"], {}),
                                  ("Tab: gateway replay --", [],
                                   completing("gateway replay --"))):
            ours, theirs = [], []
            for _ in range(args.rounds):  # interleaved, so load drifts hit both alike
                ours += timed([*here, *extra], env, 1)
                theirs += timed([*here, *extra], env, 1, cwd=args.baseline)
            paired.append((label, statistics.median(ours), statistics.median(theirs)))
            print(f"paired {label:30s} {statistics.median(ours) * 1000:7.1f} ms vs "
                  f"{statistics.median(theirs) * 1000:7.1f} ms", flush=True)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [f"# CLI start-up ({args.rounds} rounds each, load {load})", "",
             "| case | median ms | min-max ms | vs `python -c pass` | under 0.3 s |",
             "|---|---|---|---|---|"]
    for label, median, low, high, ratio in rows:
        verdict = "" if label.startswith("floor") else ("yes" if median < TARGET_S else "**no**")
        lines.append(f"| {label} | {median * 1000:.0f} | {low * 1000:.0f}-{high * 1000:.0f} "
                     f"| {ratio:.2f}x | {verdict} |")
    if paired:
        lines += ["", f"Paired with the baseline ({args.baseline}), `python -m gateway`, "
                  "interleaved:", "", "| case | this tree ms | baseline ms | ratio |",
                  "|---|---|---|---|"]
        lines += [f"| {label} | {ours * 1000:.0f} | {theirs * 1000:.0f} | {ours / theirs:.2f}x |"
                  for label, ours, theirs in paired]
    lines += ["", "Slowest imports of `gateway --version` (`python -X importtime`, cumulative "
              "µs):", ""]
    lines += [f"    {us:8d}  {name}" for us, name in slowest_imports(script)]
    OUT.mkdir(exist_ok=True)
    (OUT / "cli_startup.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    misses = [label for label, median, *_ in rows
              if not label.startswith("floor") and median >= TARGET_S]
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
