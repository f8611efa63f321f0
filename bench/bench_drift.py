"""Benchmark: ``gateway drift --all`` against ``gateway export --all`` over the same sessions.

Both commands run in-process through ``app.cli.main`` over a JSONL data directory generated
here with the real writer (``persist_call``): ``--sessions`` sessions, each with
``--versions`` prompt versions of an ~8 KB five-section prompt whose memory section grows by a
line per version (as ``memory_write`` makes it grow) and whose mood changes, and a few calls
per version. Output goes to /dev/null. The floor is ``export --all --format jsonl`` measured
in the same run; the target is drift <= 10x the floor (issue 17: it was 55x, 334 s vs 6 s over
609 sessions). Medians of ``--reps`` repetitions.

Run: .venv/bin/python bench/bench_drift.py [--sessions 200] [--versions 8] [--reps 3]
Writes a markdown report to stdout and to bench/out/drift.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.cli import main
from bench.bench_sessions import PARAMS, TOOLS, eight_kb_sections, prose
from sessions import entries
from sessions.jsonl import JsonlSessionStore
from sessions.persist import persist_call, record_outcome
from sessions.records import CallRequest, Outcome, Prompt, Section

TARGET = 10.0


async def generate(data_dir: Path, sessions: int, versions: int) -> None:
    rng = random.Random(17)
    store = JsonlSessionStore(data_dir, durability="none")
    for n in range(sessions):
        writer = await store.create(channel="web", conversation=f"c{n}")
        memory = [prose(rng, 80) for _ in range(20)]
        count = 0
        for version in range(versions):
            memory.append(prose(rng, 80))
            sections = [s if s.name != "mood" else Section("mood", f"## Mood\n{prose(rng, 40)}")
                        for s in eight_kb_sections("\n- ".join(memory))]
            prompt = Prompt.from_sections(sections)
            for _ in range(3):
                await writer.append([entries.message(
                    {"role": "user", "content": prose(rng, 120)})])
                count += 1
                request = CallRequest(prompt, "initial" if version == 0 else "rebuilt", TOOLS,
                                      "anthropic", "claude-sonnet-4-5", PARAMS, ((0, count),))
                call = (await persist_call(writer, request)).call
                await writer.append([entries.message(
                    {"role": "assistant", "content": [{"type": "text",
                                                        "text": prose(rng, 200)}]})])
                count += 1
                await record_outcome(writer, Outcome(call, "end_turn", {"input_tokens": 2000,
                                                                         "output_tokens": 90},
                                                     800.0))
        await writer.aclose()
    await store.aclose()


def timed(argv: list[str]) -> float:
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), \
            contextlib.redirect_stderr(sink):
        started = time.perf_counter()
        code = main(argv)
        elapsed = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"{' '.join(argv)} exited {code}")
    return elapsed


def measure(args: argparse.Namespace) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        asyncio.run(generate(data, args.sessions, args.versions))
        common = ["--all", "--data-dir", str(data)]
        exports, drifts, ratios = [], [], []
        for _ in range(args.reps):
            export = timed(["export", *common, "--format", "jsonl"])
            drift = timed(["drift", *common, "--format", "csv"])
            exports.append(export)
            drifts.append(drift)
            ratios.append(drift / export)
    ratio = statistics.median(ratios)
    verdict = "PASS" if ratio <= TARGET else "FAIL"
    return "\n".join([
        "# drift --all against export --all",
        "",
        f"{args.sessions} sessions x {args.versions} prompt versions (3 calls each), "
        f"{args.reps} repetitions, medians.",
        "",
        "| command | median s |",
        "|---|---|",
        f"| export --all --format jsonl (floor) | {statistics.median(exports):.2f} |",
        f"| drift --all --format csv | {statistics.median(drifts):.2f} |",
        "",
        f"ratio drift/export: {ratio:.2f}x (target <= {TARGET:.0f}x): {verdict}",
        "",
    ])


def main_() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--versions", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    report = measure(parser.parse_args())
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "drift.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main_()
