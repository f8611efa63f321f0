"""Benchmark: what choosing a call's tool set costs, per tenant, with MCP-sized tool lists.

Every provider call asks ``ToolRegistry.for_tenant(tenant)`` for its tools and the persist step
fingerprints that set. Five built-in tools plus 40 tools from a source, 100 tenants (half of
them granted the source). Timed per call, medians of several rounds:

- floor: one ``dict.get`` (the least any per-tenant lookup can cost)
- hit: ``for_tenant`` when nothing changed, plus the persist step's fingerprint lookup (the
  hot path)
- change: the same right after the source changed (rebuild the tenant's set; fingerprint it)

Target: the hot path (hit) under 10 us a call, i.e. well under 1 % of even the fastest
provider call (milliseconds); a change costs one rebuild per tenant, not one per call.

Run: .venv/bin/python bench/bench_tools.py [--calls 20000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.agent.tools import ToolRegistry
from gateway.edge.messages import ChannelContext
from gateway.edge.tools import ToolResult
from sessions.persist import _tools_fp

SCHEMA = {"type": "object", "properties": {"query": {"type": "string", "maxLength": 200},
                                           "limit": {"type": "integer"}}, "required": ["query"]}


class Tool:
    description = "A tool of the benchmark, with a realistic description and schema."
    input_schema: Mapping[str, Any] = SCHEMA

    def __init__(self, name: str, server: str) -> None:
        self.name, self.server, self.remote_name = name, server, name

    async def run(self, args: Mapping[str, Any], context: ChannelContext) -> ToolResult:
        return ToolResult("")


class Source:
    def __init__(self, count: int) -> None:
        self.tools = [Tool(f"srv__tool_{i}", "srv") for i in range(count)]
        self.generation = 0

    def tools_for(self, tenant: str) -> Sequence[Tool]:
        return self.tools if int(tenant[1:]) % 2 == 0 else []

    def health(self) -> Mapping[str, Mapping[str, Any]]:
        return {}

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...


def per_call(fn: Any, calls: int) -> float:
    started = time.perf_counter()
    fn(calls)
    return (time.perf_counter() - started) / calls * 1e9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    tenants = [f"T{i}" for i in range(100)]
    source = Source(40)
    registry = ToolRegistry([Tool(f"builtin_{i}", "persona") for i in range(5)], [source])
    table = {t: registry.for_tenant(t) for t in tenants}

    def floor(n: int) -> None:
        for i in range(n):
            table.get(tenants[i % 100])

    def hit(n: int) -> None:
        for i in range(n):
            _tools_fp(registry.for_tenant(tenants[i % 100]).schemas)

    def change(n: int) -> None:
        for i in range(n):
            source.generation += 1
            source.tools = [*source.tools[:-1], Tool("srv__tool_39", "srv")]
            _tools_fp(registry.for_tenant(tenants[i % 100]).schemas)

    results: dict[str, list[float]] = {"floor": [], "hit": [], "change": []}
    for _ in range(args.rounds):  # the hot path first: a change makes every tenant rebuild once
        results["floor"].append(per_call(floor, args.calls))
        results["hit"].append(per_call(hit, args.calls))
    for _ in range(args.rounds):
        results["change"].append(per_call(change, max(1, args.calls // 20)))
    medians = {k: statistics.median(v) for k, v in results.items()}
    for name, value in medians.items():
        print(f"{name:7s} {value / 1000:9.3f} us/call  ({value / medians['floor']:.1f}x floor)")


if __name__ == "__main__":
    main()
