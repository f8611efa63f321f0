"""``gateway replay ID --rerun N`` after MCP tool rounds: by default the rerun's tool calls get
the recorded results (an image a tool returned included, its bytes loaded from the blob store)
and no MCP server is called; ``--live-tools`` runs them against the configured servers and
says which results differ from the recorded ones."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.app.cli.test_rerun import acli
from tests.e2e.replaying import assert_shows_what_was_read
from tests.e2e.test_mcp_tools import mcp_gateway, tool_round
from tests.e2e.test_provider_replay import API, make_provider
from tests.fakes.memory_channel import MemoryChannel
from tests.fakes.providers import FakeProviderServer, Reply, ToolCall
from tests.toolsets.mcp.harness import stdio_spec
from tests.toolsets.mcp.servers import PICTURE


def provider_env(monkeypatch: pytest.MonkeyPatch, api: str, srv: FakeProviderServer) -> None:
    """The settings a rerun builds the recorded provider from (the fake server's URL)."""
    for name in ("GATEWAY_MODEL", "GATEWAY_STREAM", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    if api == "anthropic":
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", srv.anthropic_base_url)
    else:
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        monkeypatch.setenv("OPENAI_BASE_URL", srv.openai_base_url)
    monkeypatch.setenv("GATEWAY_PROVIDER_RETRIES", "0")


def same_ids(body: dict[str, Any], api: str) -> str:
    """The body's messages as JSON with tool call ids numbered in order (each call of the
    fake provider draws fresh ids; everything else must be equal)."""
    text = orjson.dumps(body["messages"]).decode()
    calls = [c["id"] for m in body["messages"] if m["role"] == "assistant"
             for c in (m.get("tool_calls") or [] if api == "openai" else
                       [b for b in m["content"] if b.get("type") == "tool_use"])]
    for n, ident in enumerate(calls):
        text = text.replace(ident, f"call-{n}")
    return text


@pytest.mark.parametrize("api", API)
async def test_rerun_reuses_recorded_results_or_runs_live(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: str
) -> None:
    """Recorded results: the rerun's second call sends the same messages as the recorded one,
    the tool's image included (loaded from the blob store), and the server's call log is
    unchanged. Live: the server is called again; stable results (the same image is the same
    reference) are "same as recorded", the pid "DIFFERS"."""
    calls = tmp_path / "calls.log"
    channel = MemoryChannel("mem", tenant="acme")
    answer = [Reply.tool_uses(ToolCall("desk__lookup", {"key": "abc"}),
                              ToolCall("desk__pid", {}), ToolCall("desk__picture", {})),
              Reply.text("All looked up.")]
    async with FakeProviderServer() as srv:
        async with mcp_gateway(tmp_path, make_provider(api, srv),
                               {"desk": stdio_spec(calls)}, [channel]):
            srv.script(api, *answer)
            accepted = await channel.say("c1", "look everything up")
            await channel.wait_replies(1, timeout=30)
        assert accepted is not None
        recorded: dict[str, Any] = srv.requests_for(api)[1].body
        assert tool_round(recorded, api)[2] == [("image/png", PICTURE)]
        assert calls.read_text().split() == ["lookup", "pid", "picture"]
        provider_env(monkeypatch, api, srv)
        monkeypatch.setenv("GATEWAY_MCP_CONFIG", str(tmp_path / "mcp.json"))
        monkeypatch.setenv("GATEWAY_MCP_START_TIMEOUT", "90")
        data_dir = tmp_path / "data"
        assert accepted.session_id is not None
        assert await asyncio.to_thread(
            assert_shows_what_was_read, data_dir, accepted.session_id, tenant="acme",
            received=[r.body for r in srv.requests_for(api)]) == 2
        args = (accepted.session_id, "--tenant", "acme", "--rerun", "1")

        srv.script(api, *answer)
        code, out, err = await acli(data_dir, *args)
        assert (code, err) == (0, "")
        assert calls.read_text().split() == ["lookup", "pid", "picture"]  # no server call
        rerun = srv.requests_for(api)[3].body
        assert same_ids(rerun, api) == same_ids(recorded, api)
        assert "result (recorded): abc is filed under shelf 0\n" in out
        assert "--- new answer, call 2 (stop " in out
        assert out.endswith("All looked up.\n")

        srv.script(api, *answer)
        code, out, err = await acli(data_dir, *args, "--live-tools")
        assert (code, err) == (0, "")
        assert calls.read_text().split() == ["lookup", "pid", "picture"] * 2
        assert "result (live, same as recorded): abc is filed under shelf 0\n" in out
        assert 'result (live, same as recorded): [{"type":"text","text":"[image: picture-1]"}' \
            in out
        assert out.count("DIFFERS from the recorded result") == 1
        live = srv.requests_for(api)[5].body
        assert tool_round(live, api)[2] == [("image/png", PICTURE)]
