"""Benchmark: what the one-process duplicate check holds in memory a message answered.

An owed journal in memory (``FileJournal(None)``) takes N messages of the gateway's shapes
(``tenant:channel:chat:platform id`` keys over 2,000 chats, 16-hex item ids, one session a
chat), each owed then answered; ``tracemalloc`` counts what stays allocated, per message. Run
against this checkout and, with ``--tree``, an older one (``git archive`` of it) in the same
run, alternating, so the ratio compares like with like. Not a test: a report.

    .venv/bin/python bench/bench_dedup_memory.py --tree /tmp/before --messages 100000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = r"""
import asyncio, json, sys, tracemalloc
from coordination.journal import FileJournal

async def main(n):
    # Keys and item ids are made per message inside the count, as the gateway makes them (the
    # journal may be all that holds them); sessions are one string a chat, made before.
    sessions = [f"20261206-0850{c:04d}-{c:08x}" for c in range(2000)]
    journal = FileJournal(None, fsync="none", **({"max_seen_bytes": 1 << 40}
                          if "max_seen_bytes" in FileJournal.__init__.__code__.co_varnames
                          else {}))
    await journal.open()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(n):
        item = f"{i * 2654435761 % (1 << 64):016x}"
        await journal.owe(item, "c", f"default:telegram:{i % 2000}:{1_000_000 + i}", "")
        await journal.paid(item, sessions[i % 2000])
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert journal.seen(f"default:telegram:{(n - 1) % 2000}:{1_000_000 + n - 1}") is not None
    print(json.dumps({"per_message": held / n, "keys": len(journal)}))

asyncio.run(main(int(sys.argv[1])))
"""


def probe(tree: Path, messages: int) -> float:
    out = subprocess.run([sys.executable, "-c", PROBE, str(messages)], check=True,
                         capture_output=True, text=True, cwd=tree,
                         env={**os.environ, "PYTHONPATH": str(tree)}).stdout
    return float(json.loads(out)["per_message"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tree", type=Path, help="an older checkout to compare with")
    args = parser.parse_args()
    trees = {"this checkout": ROOT} | ({"--tree": args.tree} if args.tree else {})
    found: dict[str, list[float]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            found[name].append(probe(tree, args.messages))
    print(f"{args.messages} messages answered, {args.rounds} rounds, bytes a message held:")
    medians = {name: statistics.median(v) for name, v in found.items()}
    for name, values in found.items():
        print(f"  {name}: median {medians[name]:.0f} ({', '.join(f'{v:.0f}' for v in values)})")
    if args.tree:
        print(f"  ratio this / --tree: {medians['this checkout'] / medians['--tree']:.2f}")


if __name__ == "__main__":
    main()
