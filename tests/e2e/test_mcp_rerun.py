"""``gateway replay ID --rerun N`` after MCP tool rounds: by default the rerun's tool calls get
the recorded results and no MCP server is called; ``--live-tools`` runs them against the
configured servers and says which results differ from the recorded ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.app.cli.test_rerun import acli
from tests.e2e.test_mcp_tools import mcp_gateway
from tests.e2e.test_provider_replay import make_provider
from tests.fakes.memory_channel import MemoryChannel
from tests.fakes.providers import FakeProviderServer, Reply, ToolCall
from tests.toolsets.mcp.harness import stdio_spec


def tool_results(body: dict[str, object]) -> list[object]:
    messages = body["messages"]
    assert isinstance(messages, list)
    return [b["content"] for b in messages[-1]["content"] if b.get("type") == "tool_result"]


async def test_rerun_reuses_recorded_results_or_runs_live(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recorded results: same tool results sent, the server's call log unchanged. Live: the
    server is called again; a stable result is "same as recorded", the pid "DIFFERS"."""
    calls = tmp_path / "calls.log"
    channel = MemoryChannel("mem", tenant="acme")
    answer = [Reply.tool_uses(ToolCall("desk__lookup", {"key": "abc"}),
                              ToolCall("desk__pid", {})),
              Reply.text("All looked up.")]
    async with FakeProviderServer() as srv:
        async with mcp_gateway(tmp_path, make_provider("anthropic", srv),
                               {"desk": stdio_spec(calls)}, [channel]):
            srv.script("anthropic", *answer)
            accepted = await channel.say("c1", "look everything up")
            await channel.wait_replies(1, timeout=30)
        assert accepted is not None
        recorded = srv.requests_for("anthropic")[1].body
        assert calls.read_text().split() == ["lookup", "pid"]
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", srv.anthropic_base_url)
        monkeypatch.setenv("GATEWAY_PROVIDER_RETRIES", "0")
        monkeypatch.setenv("GATEWAY_MCP_CONFIG", str(tmp_path / "mcp.json"))
        monkeypatch.setenv("GATEWAY_MCP_START_TIMEOUT", "90")
        data_dir = tmp_path / "data"
        args = (accepted.session_id, "--tenant", "acme", "--rerun", "1")

        srv.script("anthropic", *answer)
        code, out, err = await acli(data_dir, *args)
        assert (code, err) == (0, "")
        assert calls.read_text().split() == ["lookup", "pid"]  # no call reached the server
        rerun = srv.requests_for("anthropic")[3].body
        assert tool_results(rerun) == tool_results(recorded)
        assert "result (recorded): abc is filed under shelf 0\n" in out
        assert "--- new answer, call 2 (stop end_turn" in out
        assert out.endswith("All looked up.\n")

        srv.script("anthropic", *answer)
        code, out, err = await acli(data_dir, *args, "--live-tools")
        assert (code, err) == (0, "")
        assert calls.read_text().split() == ["lookup", "pid", "lookup", "pid"]
        assert "result (live, same as recorded): abc is filed under shelf 0\n" in out
        assert "result (live, DIFFERS from the recorded result): " in out
        assert f"  recorded: {tool_results(recorded)[1]}\n" in out
