"""MCP tools end to end: a stdio and a streamable-HTTP MCP server (written with the SDK's server
API) serve a gateway whose provider is the real Anthropic or OpenAI SDK against the fake
provider servers. Every tool kind is used in a conversation; every body the provider received
equals ``gateway replay --request N`` byte for byte; images reach the model as images (inside the
Anthropic tool_result, in a user message after the OpenAI tool message), stored once in the blob
store and fitted to the provider's limits, the log holding only references; a slow tool times
out into a tool error and the turn still answers; a tenant without the HTTP server never sees
its tools; the full /healthz reports each server."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from PIL import Image

from app.compose import build_gateway
from app.compose_store import blob_store_for
from app.config import Settings
from app.server import Gateway
from gateway.access.gate import AccessPolicy
from gateway.agent.tools import ToolRegistry
from gateway.media.images import IMAGE_LIMITS
from sessions.replay import replay_bytes
from sessions.shapes import TOOL_FILES_INTRO
from tests.e2e.replaying import assert_shows_what_was_read, replay_cli
from tests.e2e.test_provider_replay import API, make_provider
from tests.fakes.memory_channel import MemoryChannel
from tests.fakes.providers import FakeProviderServer, Reply
from tests.toolsets.mcp.harness import eventually, http_server, stdio_spec
from tests.toolsets.mcp.servers import PICTURE


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
    text, error, _files = tool_round(body, api)
    return text, error


def tool_round(body: dict[str, Any], api: str) -> tuple[str, bool, list[tuple[str, bytes]]]:
    """The last tool result the provider got: its text, is_error as far as the shape says, and
    the files shown with it as (media type, bytes), read back from the shape's own blocks."""
    messages = body["messages"]
    if api == "openai":
        at = max(i for i, m in enumerate(messages) if m["role"] == "tool")
        tool, after = messages[at], messages[at + 1:]
        files: list[tuple[str, bytes]] = []
        if after:  # the files follow the tool message, introduced by the call they belong to
            (shown,) = after
            assert shown["role"] == "user"
            intro, *parts = shown["content"]
            assert intro == {"type": "text",
                             "text": TOOL_FILES_INTRO.format(id=tool["tool_call_id"])}
            for part in parts:
                head, data = part["image_url"]["url"].split(",", 1)
                files.append((head.removeprefix("data:").removesuffix(";base64"),
                              base64.b64decode(data)))
        return tool["content"], False, files
    block = messages[-1]["content"][-1]
    content = block["content"]
    if isinstance(content, str):
        return content, bool(block.get("is_error")), []
    text = "".join(b["text"] for b in content if b["type"] == "text")
    files = [(b["source"]["media_type"], base64.b64decode(b["source"]["data"]))
             for b in content if b["type"] == "image"]
    return text, bool(block.get("is_error")), files


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
            ("show me the poster", "desk__poster", {}),
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
        registry = next(p.context for p in gateway.parts if isinstance(p.context, ToolRegistry))
        await eventually(lambda: "desk__extra" in registry.for_tenant("acme"))
        srv.script(api, Reply.tool_use("desk__extra", {"word": "hi"}), Reply.text("HI it is"))
        await acme.say("c1", "use the new tool")
        await acme.wait_replies(8, timeout=30)
        await other.say("c2", "hello from elsewhere")
        await other.wait_replies(1, timeout=30)
        bodies = [r.body for r in srv.requests_for(api)]
        raws = [r.raw for r in srv.requests_for(api)]
        metrics = gateway.metrics.render().decode()
        acme_sid, acme_log = await session_of(gateway, "acme")
        other_sid, _ = await session_of(gateway, "other")
        acme_raw = await gateway.store.read_log("acme", acme_sid)
        blobs = blob_store_for(gateway.store, tmp_path / "data")
        stored = {b.hash for b in await blobs.list_blobs("acme")}
        await blobs.aclose()

    assert len(bodies) == 17
    acme_bodies, other_bodies = bodies[:16], bodies[16:]
    rounds = [tool_round(acme_bodies[i], api) for i in range(1, 16, 2)]
    results = [(text, error) for text, error, _ in rounds]
    assert results[0][0] == "abc is filed under shelf 0"
    assert results[1][0] == "[image: picture-1]"
    assert results[2][0] == "Here is the poster:\n[image: poster-1]"
    assert results[3][0].endswith("the ticket system is down")
    assert results[4][0] == "the tool did not answer within 3 s"
    assert results[5][0] == "q is filed under shelf 1"
    assert results[7][0] == "HI"
    if api == "anthropic":
        assert [error for _, error in results] == [False, False, False, True, True, False,
                                                   False, False]
    # The small PNG is within limits: sent byte for byte. The poster is wider than the
    # provider takes: scaled to its long-edge limit and re-encoded (no alpha: JPEG).
    assert rounds[1][2] == [("image/png", PICTURE)]
    ((poster_type, poster),) = rounds[2][2]
    assert poster_type == "image/jpeg"
    assert max(Image.open(io.BytesIO(poster)).size) == IMAGE_LIMITS[api].max_edge
    assert [files for i, (_, _, files) in enumerate(rounds) if i not in (1, 2)] == [[]] * 6
    # The log refers to both by hash; the bytes are in the blob store, once, not in the log.
    digests = {hashlib.sha256(PICTURE).hexdigest(), hashlib.sha256(poster).hexdigest()}
    assert stored == digests
    assert all(d.encode() in acme_raw for d in digests)
    assert base64.b64encode(PICTURE) not in acme_raw
    assert base64.b64encode(poster)[:200] not in acme_raw
    assert all("web__lookup" in tool_names(b, api) for b in acme_bodies)
    assert "desk__extra" in tool_names(acme_bodies[14], api)
    assert "desk__extra" not in tool_names(acme_bodies[0], api)
    assert tool_names(other_bodies[0], api)  # the persona's and desk's tools, never web's
    assert not any(name.startswith("web__") for name in tool_names(other_bodies[0], api))
    assert "desk__lookup" in tool_names(other_bodies[0], api)

    outcomes = [acme_log.messages.entry(i)["meta"]["toolCalls"][0]
                for i in range(len(acme_log.messages))
                if "toolCalls" in (acme_log.messages.entry(i).get("meta") or {})]
    assert [(c["server"], c["name"], c["outcome"]) for c in outcomes] == [
        ("desk", "lookup", "ok"), ("web", "picture", "ok"), ("desk", "poster", "ok"),
        ("desk", "fail", "error"),
        ("desk", "slow", "timeout"), ("web", "lookup", "ok"), ("desk", "grow", "ok"),
        ("desk", "extra", "ok"),
    ]
    assert outcomes[4]["ms"] >= 3000
    assert len(acme_log.tool_sets) >= 2  # the grown tool set is its own tools entry
    assert 'gateway_tool_calls_total{outcome="timeout",server="desk",tool="slow"} 1.0' in metrics
    assert 'gateway_tool_latency_seconds_count{server="web",tool="picture"} 1.0' in metrics

    data = tmp_path / "data"
    for tenant, sid, sent, got in (("acme", acme_sid, raws[:16], acme_bodies),
                                   ("other", other_sid, raws[16:], other_bodies)):
        assert await asyncio.to_thread(assert_shows_what_was_read, data, sid, tenant=tenant,
                                       received=got) == len(sent)
        for n, raw in enumerate(sent, start=1):
            code, out = await asyncio.to_thread(replay_cli, data, sid, "--tenant", tenant,
                                                "--request", str(n), "--shape", api, "--raw")
            assert code == 0
            assert out.encode() == raw, f"{tenant} call {n} differs from its replay"


async def test_healthz_reports_each_server_to_this_machine_only(tmp_path: Path) -> None:
    """The full /healthz (asked from this machine) has each MCP server's status and tool
    count, and a failed server does not make the gateway unhealthy; a caller elsewhere gets
    only ``{"ok": true}``."""
    servers = {"desk": stdio_spec(), "broken": {"command": str(tmp_path / "no-such-server")}}
    async with FakeProviderServer() as srv, mcp_gateway(
        tmp_path, make_provider("anthropic", srv), servers, [MemoryChannel("mem")],
    ) as gateway, aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{gateway.bound_port}/healthz"
        async with http.get(url) as response:
            status, full = response.status, await response.json()
        async with http.get(url, headers={"Host": "gateway.example.com"}) as response:
            elsewhere = response.status, await response.json()
    assert (status, full["ok"]) == (200, True)
    assert full["mcp"] == {"desk": {"status": "up", "tools": 8, "restarts": 0},
                           "broken": {"status": "failed", "tools": 0, "restarts": 0}}
    assert elsewhere == (200, {"ok": True})
