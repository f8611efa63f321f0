"""MCP tools end to end: a stdio and a streamable-HTTP MCP server (written with the SDK's server
API) serve a gateway whose provider is the real Anthropic or OpenAI SDK against the fake
provider servers. Every tool kind is used in a conversation; every body the provider received
equals ``gateway replay --request N``; a slow tool times out into a tool error and the turn
still answers; a tenant without the HTTP server never sees its tools."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.compose import build_gateway
from app.config import Settings
from app.server import Gateway
from gateway.access import AccessPolicy
from gateway.tools import ToolRegistry
from sessions.replay import replay_bytes
from tests.e2e.test_provider_replay import API, make_provider, replay_cli
from tests.fakes.memory_channel import MemoryChannel
from tests.fakes.providers import FakeProviderServer, Reply
from tests.toolsets.mcp.harness import eventually, http_server, stdio_spec


@asynccontextmanager
async def mcp_gateway(tmp_path: Path, provider: Any, servers: dict[str, Any],
                      channels: list[MemoryChannel]) -> AsyncIterator[Gateway]:
    """A gateway over memory channels (open to everyone) with these MCP servers."""
    config = tmp_path / "mcp.json"
    config.write_bytes(orjson.dumps({"mcpServers": servers}))
    settings = Settings(_env_file=None, GATEWAY_DATA_DIR=str(tmp_path / "data"), GATEWAY_PORT=0,
                        GATEWAY_MCP_CONFIG=str(config), GATEWAY_MCP_TOOL_TIMEOUT=3,
                        GATEWAY_MCP_START_TIMEOUT=90)
    local = AccessPolicy(rules={}, pairing=None,
                         unrestricted=frozenset(c.name for c in channels))
    gateway = build_gateway(settings, provider=provider, channels=channels, access=local)
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.aclose()


def tool_names(body: dict[str, Any], api: str) -> list[str]:
    tools = body.get("tools", [])
    return [t["name"] if api == "anthropic" else t["function"]["name"] for t in tools]


def last_tool_result(body: dict[str, Any], api: str) -> tuple[str, bool]:
    """The tool result the provider got last: (text, is_error as far as the shape says)."""
    if api == "openai":
        return body["messages"][-1]["content"], False
    block = body["messages"][-1]["content"][-1]
    return block["content"], bool(block.get("is_error"))


async def session_of(gateway: Gateway, tenant: str) -> tuple[str, Any]:
    sessions = await gateway.store.list_sessions(tenant)
    assert len(sessions) == 1
    sid = sessions[0].session_id
    return sid, replay_bytes(await gateway.store.read_log(tenant, sid))


@pytest.mark.parametrize("api", API)
async def test_tools_of_every_kind_replay_exactly(tmp_path: Path, api: str) -> None:
    """Text, image, failing, slow (timed out) and list-changing tools in one conversation
    (acme, both servers) and one without the HTTP server (other): answers arrive, results
    reach the provider as recorded, bodies replay byte for byte, tenants stay apart."""
    calls = tmp_path / "calls.log"
    acme, other = MemoryChannel("mem-acme", tenant="acme"), MemoryChannel("mem-other",
                                                                          tenant="other")
    async with FakeProviderServer() as srv, http_server() as url, mcp_gateway(
        tmp_path, make_provider(api, srv),
        {"desk": stdio_spec(calls), "web": {"url": url, "tenants": ["acme"]}}, [acme, other],
    ) as gateway:
        steps: list[tuple[str, str, dict[str, Any]]] = [
            ("where is abc?", "desk__lookup", {"key": "abc"}),
            ("show me the picture", "web__picture", {}),
            ("is the ticket system up?", "desk__fail", {}),
            ("do the slow thing", "desk__slow", {"seconds": 30}),
            ("web lookup q", "web__lookup", {"key": "q"}),
            ("grow a tool", "desk__grow", {}),
        ]
        for n, (text, tool, args) in enumerate(steps, start=1):
            srv.script(api, Reply.tool_use(tool, args, text_before="Checking."),
                       Reply.text(f"answer {n}"))
            await acme.say("c1", text)
            replies = await acme.wait_replies(n, timeout=30)
            assert replies[-1] == ("c1", "finish", f"Checking.\n\nanswer {n}")
        registry = next(s for s in gateway.services if isinstance(s, ToolRegistry))
        await eventually(lambda: "desk__extra" in registry.for_tenant("acme"))
        srv.script(api, Reply.tool_use("desk__extra", {"word": "hi"}), Reply.text("HI it is"))
        await acme.say("c1", "use the new tool")
        await acme.wait_replies(7, timeout=30)
        await other.say("c2", "hello from elsewhere")
        await other.wait_replies(1, timeout=30)
        bodies = [r.body for r in srv.requests_for(api)]
        metrics = gateway.metrics.render().decode()
        acme_sid, acme_log = await session_of(gateway, "acme")
        other_sid, _ = await session_of(gateway, "other")

    assert len(bodies) == 15
    acme_bodies, other_bodies = bodies[:14], bodies[14:]
    results = [last_tool_result(acme_bodies[i], api) for i in range(1, 14, 2)]
    assert results[0][0] == "abc is filed under shelf 0"
    assert results[1][0].startswith("[image, image/png, 16 bytes, sha256:")
    assert results[2][0].endswith("the ticket system is down")
    assert results[3][0] == "the tool did not answer within 3 s"
    assert results[4][0] == "q is filed under shelf 1"
    assert results[6][0] == "HI"
    if api == "anthropic":
        assert [error for _, error in results] == [False, False, True, True, False, False, False]
    assert all("web__lookup" in tool_names(b, api) for b in acme_bodies)
    assert "desk__extra" in tool_names(acme_bodies[12], api)
    assert "desk__extra" not in tool_names(acme_bodies[0], api)
    assert tool_names(other_bodies[0], api)  # the persona's and desk's tools, never web's
    assert not any(name.startswith("web__") for name in tool_names(other_bodies[0], api))
    assert "desk__lookup" in tool_names(other_bodies[0], api)

    outcomes = [acme_log.messages.entry(i)["meta"]["toolCalls"][0]
                for i in range(len(acme_log.messages))
                if "toolCalls" in (acme_log.messages.entry(i).get("meta") or {})]
    assert [(c["server"], c["name"], c["outcome"]) for c in outcomes] == [
        ("desk", "lookup", "ok"), ("web", "picture", "ok"), ("desk", "fail", "error"),
        ("desk", "slow", "timeout"), ("web", "lookup", "ok"), ("desk", "grow", "ok"),
        ("desk", "extra", "ok"),
    ]
    assert outcomes[3]["ms"] >= 3000
    assert len(acme_log.tool_sets) >= 2  # the grown tool set is its own tools entry
    assert 'gateway_tool_calls_total{outcome="timeout",server="desk",tool="slow"} 1.0' in metrics
    assert 'gateway_tool_latency_seconds_count{server="web",tool="picture"} 1.0' in metrics

    data = tmp_path / "data"
    for tenant, sid, sent in (("acme", acme_sid, acme_bodies), ("other", other_sid, other_bodies)):
        for n, body in enumerate(sent, start=1):
            code, out = await asyncio.to_thread(replay_cli, data, sid, "--tenant", tenant,
                                                "--request", str(n), "--shape", api)
            assert code == 0
            assert orjson.loads(out) == body, f"{tenant} call {n} differs from its replay"
