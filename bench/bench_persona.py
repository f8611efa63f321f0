"""Benchmark: what a prompt build costs with layers (operator, tenant, memory scope).

Every provider call asks the persona for its prompt; when nothing changed, the build is only
the hot-reload check (stat the layers' files) and a cache hit. Before scopes that check was one
scan of the single persona directory. This script times ``PersonaWorkspace.build`` for an
unchanged prompt (a person with memory and kb notes, a tenant layer present) against that floor,
one scan of the operator layer's directories, measured in the same run, rounds alternating.

Run: .venv/bin/python bench/bench_persona.py [--builds 2000] [--rounds 9]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.edge.messages import ChannelContext
from gateway.edge.scopes import scope_of
from gateway.persona.files import scan, scan_targets
from gateway.persona.workspace import KB_DIR, OPERATOR_FILES, SKILLS_DIR, PersonaWorkspace

CONTEXT = ChannelContext("slack", "private", "Ada", tenant="T0TEAM", chat="D1", person="U1")


async def measure(builds: int, rounds: int) -> tuple[list[float], list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        ws = PersonaWorkspace(Path(tmp) / "persona")
        scope = scope_of(CONTEXT)
        await ws.build(CONTEXT)
        (ws.root / "tenants" / "T0TEAM").mkdir(parents=True)
        (ws.root / "tenants" / "T0TEAM" / "TENANT.md").write_text("Team notes.\n")
        await ws.append_memory(scope, "likes tea")
        for n in range(5):
            await ws.write_kb(scope, f"note {n}", "text")
        first = await ws.build(CONTEXT)
        subject: list[float] = []
        floor: list[float] = []
        operator = scan_targets(ws.root, (SKILLS_DIR, KB_DIR))
        for _ in range(rounds):
            started = time.perf_counter()
            for _ in range(builds):
                built = await ws.build(CONTEXT)
            subject.append((time.perf_counter() - started) / builds)
            assert built.prompt is first.prompt  # the cache hit this measures
            started = time.perf_counter()
            for _ in range(builds):
                scan(operator, OPERATOR_FILES)
            floor.append((time.perf_counter() - started) / builds)
        return subject, floor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builds", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    subject, floor = asyncio.run(measure(args.builds, args.rounds))
    ratios = [s / f for s, f in zip(subject, floor, strict=True)]
    print(f"build (unchanged, 3 layers): median {statistics.median(subject) * 1e6:.1f} µs")
    print(f"floor (one operator scan):   median {statistics.median(floor) * 1e6:.1f} µs")
    print(f"ratio: median {statistics.median(ratios):.2f}x "
          f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x over {args.rounds} rounds)")


if __name__ == "__main__":
    main()
