"""MCP servers through the real SDK, stdio and streamable HTTP: tools listed and called, every
failure a tool error, list changes followed, killed servers restarted, failed ones quiet."""

from __future__ import annotations

import logging
import os
import signal
from contextlib import AsyncExitStack
from pathlib import Path

import psutil
import pytest

from gateway.edge.tools import ToolMedia
from toolsets.mcp import McpToolbox, ToolboxSettings
from toolsets.mcp.config import parse_config
from toolsets.mcp.connection import Backoff, ConnectionSettings

from .harness import eventually, http_server, stdio_spec
from .servers import PICTURE

FAST = Backoff(initial=0.05, maximum=0.2, reset_after=60)


def toolbox(servers: dict[str, object], **settings: object) -> McpToolbox:
    # Generous start bounds: a loaded CI machine can take seconds to start a Python server.
    connection = ConnectionSettings(**{"call_timeout": 10.0, "backoff": FAST,
                                       "connect_timeout": 60.0, **settings})
    return McpToolbox(parse_config({"mcpServers": servers}),
                      ToolboxSettings(connection=connection, start_timeout=90))


def tools(box: McpToolbox, tenant: str = "default") -> dict[str, object]:
    return {t.name: t for t in box.tools_for(tenant)}


async def call(box: McpToolbox, name: str, args: dict[str, object] | None = None,
               tenant: str = "default") -> tuple[str, str]:
    tool = {t.name: t for t in box.tools_for(tenant)}[name]
    result = await tool.run(args or {}, None)  # type: ignore[arg-type]
    return result.kind, result.text


async def test_stdio_results_errors_timeout_and_oversize(tmp_path: Path) -> None:
    """Text, a tool error, an image (its bytes handed on for the blob store, a line where it
    was), an oversize result and a timeout, each as the model will see it; the server still
    answers after the timeout."""
    async with toolbox({"t": stdio_spec()}, call_timeout=3.0, max_result_chars=500) as box:
        assert list(tools(box)) == ["t__lookup", "t__slow", "t__fail", "t__picture",
                                    "t__poster", "t__pid", "t__big", "t__grow"]
        assert await call(box, "t__lookup", {"key": "abc"}) == ("ok",
                                                                "abc is filed under shelf 0")
        kind, text = await call(box, "t__fail")
        assert (kind, text.endswith("the ticket system is down")) == ("error", True)
        picture = await tools(box)["t__picture"].run({}, None)  # type: ignore[attr-defined]
        assert (picture.kind, picture.text) == ("ok", "[image: picture-1]")
        assert picture.media == (ToolMedia(PICTURE, "image/png", "picture-1"),)
        assert await call(box, "t__big", {"size": 501}) == (
            "oversize", "the tool's result was too large (501 characters; the limit is 500)")
        assert await call(box, "t__slow", {"seconds": 30}) == (
            "timeout", "the tool did not answer within 3 s")
        assert (await call(box, "t__lookup", {"key": "b"}))[0] == "ok"


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_list_changed_makes_a_new_tool_set(protocol: str) -> None:
    """tools/list_changed (the 2026 event stream, or the older notification) is followed by
    a re-list: the new tool is offered and the toolbox's generation moves."""
    async with toolbox({"t": stdio_spec(protocol=protocol)}) as box:
        server = box.server("t")
        assert server is not None
        assert server.protocol is not None
        assert server.protocol.startswith("2026") == (protocol == "auto")
        before = box.generation
        assert await call(box, "t__grow") == ("ok", "grown")
        await eventually(lambda: "t__extra" in tools(box))
        assert box.generation > before
        assert await call(box, "t__extra", {"word": "hi"}) == ("ok", "HI")


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_killed_server_is_restarted(protocol: str) -> None:
    """A stdio server killed with SIGKILL is started again (after backoff) and serves the same
    tools; calls while it is down are "unavailable" tool errors, never exceptions."""
    async with toolbox({"t": stdio_spec(protocol=protocol)}) as box:
        server = box.server("t")
        assert server is not None
        _, first = await call(box, "t__pid")
        offered = list(tools(box))
        os.kill(int(first), signal.SIGKILL)
        if protocol == "legacy":  # no event stream: the next call finds the server gone
            kind, text = await call(box, "t__lookup", {"key": "x"})
            assert (kind, "went away" in text or "not available" in text) == (
                "unavailable", True)
        await eventually(lambda: server.connects == 2 and server.status == "connected")
        assert list(tools(box)) == offered
        _, second = await call(box, "t__pid")
        assert second != first
        assert box.health() == {"t": {"status": "up", "tools": 8, "restarts": 1}}


async def test_server_that_cannot_start_is_one_log_line(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """A server whose command does not exist: start returns, the other server's tools are
    offered, its own are absent, and retries do not repeat the warning."""
    caplog.set_level(logging.DEBUG, logger="toolsets.mcp")
    missing = str(tmp_path / "no-such-server")
    async with toolbox({"broken": {"command": missing}, "t": stdio_spec()}) as box:
        broken = box.server("broken")
        assert broken is not None
        await eventually(lambda: broken.attempts >= 3)
        assert broken.status == "failed"
        assert all(not name.startswith("broken__") for name in tools(box))
        assert "t__lookup" in tools(box)
        assert box.health() == {"broken": {"status": "failed", "tools": 0, "restarts": 0},
                                "t": {"status": "up", "tools": 8, "restarts": 0}}
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "broken" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("MCP server broken failed to start (")


async def test_health_says_restarting_while_a_lost_server_stays_down() -> None:
    """An HTTP server that was up and is gone: /healthz's part says ``restarting`` (not
    failed: it was up) and still counts its tools, which stay offered while it is away."""
    async with AsyncExitStack() as stack:
        web = AsyncExitStack()
        stack.push_async_callback(web.aclose)
        url = await web.enter_async_context(http_server())
        box = await stack.enter_async_context(toolbox({"web": {"url": url}}))
        server = box.server("web")
        assert server is not None
        assert box.health() == {"web": {"status": "up", "tools": 8, "restarts": 0}}
        await web.aclose()  # the server process ends
        assert (await call(box, "web__lookup", {"key": "x"}))[0] == "unavailable"
        await eventually(lambda: server.attempts >= 3)
        assert box.health() == {"web": {"status": "restarting", "tools": 8, "restarts": 0}}


async def test_closing_stops_the_stdio_process() -> None:
    """aclose ends the server process (no orphan left behind)."""
    async with toolbox({"t": stdio_spec()}) as box:
        _, pid = await call(box, "t__pid")
    process_gone = not psutil.pid_exists(int(pid)) or (
        psutil.Process(int(pid)).status() == psutil.STATUS_ZOMBIE)
    assert process_gone


async def test_http_server_tools_by_tenant() -> None:
    """A streamable-HTTP server granted to one tenant: that tenant sees and calls its tools
    (text and image), another tenant sees none."""
    async with http_server() as url, toolbox({"web": {"url": url, "tenants": ["acme"],
                                                      "denyTools": ["big", "p?d"]}}) as box:
        assert list(tools(box, "acme")) == ["web__lookup", "web__slow", "web__fail",
                                            "web__picture", "web__poster", "web__grow"]
        assert tools(box, "other") == {}
        assert await call(box, "web__lookup", {"key": "q"}, tenant="acme") == (
            "ok", "q is filed under shelf 1")
        kind, text = await call(box, "web__picture", tenant="acme")
        assert (kind, text) == ("ok", "[image: picture-1]")
