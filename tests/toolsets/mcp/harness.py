"""The test MCP servers as configured servers: stdio (a child per connection) and HTTP (one
process per test, on a free loopback port)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tests.waiting import until

REPO = Path(__file__).resolve().parents[3]
SERVER_MODULE = "tests.toolsets.mcp.servers"


def stdio_spec(calls: Path | None = None, **extra: Any) -> dict[str, Any]:
    """The mcpServers entry of the stdio test server (``calls``: its call log file)."""
    spec: dict[str, Any] = {"command": sys.executable, "args": ["-m", SERVER_MODULE],
                            "cwd": str(REPO), **extra}
    if calls is not None:
        spec["env"] = {"MCP_TEST_CALLS": str(calls)}
    return spec


@asynccontextmanager
async def http_server(calls: Path | None = None) -> AsyncIterator[str]:
    """Run the HTTP test server; yields its MCP endpoint URL."""
    env = {"MCP_TEST_CALLS": str(calls)} if calls is not None else {}

    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", SERVER_MODULE, "http", cwd=REPO,
        stdout=asyncio.subprocess.PIPE, env={**os.environ, **env},
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(30):
            port = int((await process.stdout.readline()).decode())
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        if process.returncode is None:
            process.terminate()
        try:
            async with asyncio.timeout(20):
                await process.communicate()  # to EOF: the transport closes, nothing left at GC
        except TimeoutError:
            process.kill()
            await process.communicate()


eventually = until  # polled waits: see tests/waiting.py
