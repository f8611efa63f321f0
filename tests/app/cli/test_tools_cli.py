"""``gateway tools list``: every configured MCP server with its status, its tools by MCP name
(and the model-facing name, or why not offered) and who sees it; exit 1 if one is down."""

from __future__ import annotations

import asyncio
import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import orjson
import pytest

from app.cli import main as cli_main
from tests.toolsets.mcp.harness import stdio_spec


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli_main(["tools", *args])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    config = tmp_path / "mcp.json"
    config.write_bytes(orjson.dumps({"mcpServers": {
        "desk": stdio_spec(tenants=["T1"], denyTools=["big", "grow"]),
        "broken": {"command": str(tmp_path / "missing-server")},
    }}))
    monkeypatch.setenv("GATEWAY_MCP_CONFIG", str(config))
    monkeypatch.setenv("GATEWAY_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("GATEWAY_MCP_START_TIMEOUT", "90")
    return config


async def test_lists_servers_tools_and_tenants(configured: Path) -> None:
    """A running server lists its tools with the names the model sees (denied ones marked);
    a server that cannot start is shown failed with its reason, and the exit code is 1."""
    code, out, _ = await asyncio.to_thread(cli, "list")
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith("desk  connected  stdio: python")
    assert lines[1:10] == [
        "  tenants: T1",
        "  lookup   -> desk__lookup",
        "  slow     -> desk__slow",
        "  fail     -> desk__fail",
        "  picture  -> desk__picture",
        "  poster   -> desk__poster",
        "  pid      -> desk__pid",
        "  big      (not offered: allowTools/denyTools)",
        "  grow     (not offered: allowTools/denyTools)",
    ]
    assert lines[10].startswith("broken  failed (FileNotFoundError: ")
    assert lines[11:] == ["  tenants: all", "  (no tools listed)"]


async def test_tenant_filter_and_json(configured: Path) -> None:
    """--tenant T2 leaves out the server granted to T1 only; --json carries the same facts."""
    code, out, _ = await asyncio.to_thread(cli, "list", "--tenant", "T2", "--json")
    assert code == 1
    assert [(s["name"], s["status"], s["tenants"], s["tools"]) for s in orjson.loads(out)] == [
        ("broken", "failed", None, [])]


def test_unset_and_invalid_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No GATEWAY_MCP_CONFIG: says so, exit 0; an invalid file: one line, exit 2."""
    monkeypatch.delenv("GATEWAY_MCP_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)  # no .env here
    assert cli("list") == (0, "no MCP servers: GATEWAY_MCP_CONFIG is not set\n", "")
    bad = tmp_path / "bad.json"
    bad.write_text('{"mcpServers": {"x": {"url": "ftp://nope"}}}')
    monkeypatch.setenv("GATEWAY_MCP_CONFIG", str(bad))
    assert cli("list") == (2, "", "gateway tools: MCP server 'x': url must be an http:// or "
                                  "https:// URL\n")
