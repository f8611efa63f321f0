"""The tool registry: per-tenant tool sets from sources, stable identity, recorded tool calls."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.agent.tools import ToolRegistry, run_tool_uses
from gateway.edge.messages import ChannelContext
from gateway.edge.metrics import Metrics
from gateway.edge.tools import ToolResult

WEB = ChannelContext(channel="web", chat_type="private", speaker="ada")


class EchoTool:
    description = "echo"
    input_schema: Mapping[str, Any] = {"type": "object", "properties": {}}

    def __init__(self, name: str, server: str = "s", fail: BaseException | None = None) -> None:
        self.name = name
        self.server = server
        self.remote_name = name.split("__")[-1]
        self.fail = fail

    async def run(self, args: Mapping[str, Any], context: ChannelContext) -> ToolResult:
        if self.fail is not None:
            raise self.fail
        return ToolResult(f"{self.name}:{dict(args)}")


class Source:
    """A tool source whose tools and tenant visibility the test changes by hand."""

    def __init__(self, tools: Sequence[EchoTool], tenants: set[str] | None = None) -> None:
        self.tools = list(tools)
        self.tenants = tenants
        self.generation = 0

    def tools_for(self, tenant: str) -> Sequence[EchoTool]:
        return self.tools if self.tenants is None or tenant in self.tenants else []

    def health(self) -> Mapping[str, Mapping[str, Any]]:
        return {name: {"tools": len(self.tools)} for name in sorted({t.server for t in self.tools})}

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...


def test_tenant_sets_follow_sources_and_keep_identity() -> None:
    """Each tenant sees built-ins plus what a source grants it; unchanged sets keep their
    object (so their fingerprint is computed once), a change makes a new one."""
    builtin = EchoTool("memory_write", server="persona")
    source = Source([EchoTool("notes__add")], tenants={"T1"})
    registry = ToolRegistry([builtin], sources=[source])
    t1, t2 = registry.for_tenant("T1"), registry.for_tenant("T2")
    assert [s["name"] for s in t1.schemas] == ["memory_write", "notes__add"]
    assert [s["name"] for s in t2.schemas] == ["memory_write"]
    assert registry.for_tenant("T1") is t1
    source.tools.append(EchoTool("notes__list"))
    source.generation += 1
    assert registry.for_tenant("T2") is t2  # its tools did not change: same object
    grown = registry.for_tenant("T1")
    assert grown is not t1
    assert [s["name"] for s in grown.schemas] == ["memory_write", "notes__add", "notes__list"]


async def test_tool_round_records_server_duration_and_outcome() -> None:
    """A round's results message holds each result for the model; its meta says which server
    and tool answered, how long it took and how it ended (unknown tools and crashes too)."""
    registry = ToolRegistry([], sources=[Source([
        EchoTool("notes__add"), EchoTool("notes__boom", fail=RuntimeError("bug")),
    ])])
    metrics = Metrics()
    uses = [
        {"type": "tool_use", "id": "t1", "name": "notes__add", "input": {"x": 1}},
        {"type": "tool_use", "id": "t2", "name": "notes__boom", "input": {}},
        {"type": "tool_use", "id": "t3", "name": "made_up", "input": {}},
    ]
    message, meta = await run_tool_uses(registry.for_tenant("default"), uses, WEB, metrics)
    assert message == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "notes__add:{'x': 1}"},
        {"type": "tool_result", "tool_use_id": "t2",
         "content": "the tool failed unexpectedly (RuntimeError)", "is_error": True},
        {"type": "tool_result", "tool_use_id": "t3", "content": "unknown tool 'made_up'",
         "is_error": True},
    ]}
    assert [(c["id"], c["tool"], c["server"], c["name"], c["outcome"])
            for c in meta["toolCalls"]] == [
        ("t1", "notes__add", "s", "add", "ok"),
        ("t2", "notes__boom", "s", "boom", "crash"),
        ("t3", "made_up", "-", "made_up", "unknown"),
    ]
    assert all(c["ms"] >= 0 for c in meta["toolCalls"])
    text = metrics.render().decode()
    assert 'gateway_tool_calls_total{outcome="ok",server="s",tool="add"} 1.0' in text
    assert 'gateway_tool_calls_total{outcome="unknown",server="-",tool="-"} 1.0' in text
    assert 'gateway_tool_latency_seconds_count{server="s",tool="boom"} 1.0' in text


def test_health_gathers_every_sources_parts() -> None:
    """The registry's health (the full /healthz's ``mcp``) has each source's parts by name;
    built-in tools are no part of it."""
    registry = ToolRegistry([EchoTool("memory_write", server="persona")], sources=[
        Source([EchoTool("a__x", server="a"), EchoTool("a__y", server="a")]),
        Source([EchoTool("b__x", server="b")], tenants={"T1"})])
    assert registry.health() == {"a": {"tools": 2}, "b": {"tools": 1}}
    assert ToolRegistry([EchoTool("memory_write")]).health() == {}
