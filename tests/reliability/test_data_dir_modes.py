"""The data directory is private whichever store keeps the sessions: after a PostgreSQL-mode
gateway served a message (with MCP server logs, the owed journal's state and the disk
reserve written under it), the data directory and every folder in it are 0700."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import orjson
from pydantic import SecretStr

from tests.reliability.test_bad_input import running_stack
from tests.sessions.pg import PG_URL, fresh_schema

ROOT = Path(__file__).resolve().parents[2]


def folder_modes(data_dir: Path) -> dict[str, str]:
    """Each folder under ``data_dir`` (and itself) with its permission bits, in octal."""
    folders = [data_dir, *(p for p in data_dir.rglob("*") if p.is_dir())]
    return {str(p.relative_to(data_dir)): oct(stat.S_IMODE(p.stat().st_mode))
            for p in folders}


async def test_postgres_mode_keeps_the_data_directory_0700(tmp_path: Path) -> None:
    """With sessions in PostgreSQL and an MCP stdio server, the data directory the gateway
    creates (and each folder it makes inside) is 0700, not the umask's 0755."""
    config = tmp_path / "mcp.json"
    config.write_bytes(orjson.dumps({"mcpServers": {"clock": {
        "command": sys.executable, "args": [str(ROOT / "toolsets" / "mcp" / "clock_server.py")],
    }}}))
    async with fresh_schema() as schema, running_stack(
            tmp_path, store_url=SecretStr(PG_URL), store_schema=schema,
            mcp_config=config) as stack:
        status, _ = await stack.chat({"conversation": "c1", "text": "hello"})
        modes = folder_modes(stack.data_dir)
    assert status == 200
    assert modes == dict.fromkeys(modes, "0o700")
    assert "." in modes
