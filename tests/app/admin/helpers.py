"""Sessions and servers for the viewer tests: real JSONL logs, a real server on port 0."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from app.admin import Access, AdminSite
from sessions import entries
from sessions.jsonl import JsonlSessionStore
from sessions.persist import persist_call, record_outcome
from sessions.records import Outcome
from tests.sessions.helpers import (
    PROMPT_A,
    PROMPT_B,
    TOOLS_B,
    add,
    assistant,
    call_request,
    tool_result,
    tool_use,
    user,
)

TOKEN = "adm1n-T0ken-for-the-tests_Qx7vZ9kW"
SCRIPT = "<script>alert('x')</script>"


async def rich_session(store: JsonlSessionStore, *, tenant: str = "default",
                       session_id: str = "rich-1", first: str = "remember " + SCRIPT) -> str:
    """A v3 session: a tool round, then the prompt rebuilt by memory_write for the next call."""
    writer = await store.create(tenant=tenant, channel="web", conversation="web:c1",
                                session_id=session_id)
    try:
        await add(writer, user(first))
        report = await persist_call(writer, call_request(PROMPT_A, ((0, 1),), tools=TOOLS_B))
        await add(writer, tool_use("t1", "memory_write", {"text": SCRIPT}, text="one moment"))
        await record_outcome(writer, Outcome(report.call, "tool_use", {"input_tokens": 5},
                                             12.5))
        await add(writer, tool_result("t1", "saved " + SCRIPT))
        report = await persist_call(writer, call_request(
            PROMPT_B, ((0, 3),), reason="rebuilt:memory_write", tools=TOOLS_B))
        await add(writer, assistant("done " + SCRIPT))
        await record_outcome(writer, Outcome(report.call, "end_turn", {"input_tokens": 9}, 3.0))
    finally:
        await writer.aclose()
    return session_id


def raw_session(data_dir: Path, session_id: str, *, tenant: str = "default",
                started: str = "2026-01-01T00:00:00.000Z", channel: str = "web",
                conversation: str = "web:c", first: str = "hi",
                extra_lines: list[bytes] | None = None) -> Path:
    """A small v3 log written directly (so tests choose its start time and its bytes)."""
    folder = data_dir / "sessions" if tenant == "default" else (
        data_dir / "tenants" / tenant / "sessions")
    folder.mkdir(parents=True, exist_ok=True)
    head = entries.header(session_id, started, tenant=tenant, channel=channel,
                          conversation=conversation)
    lines: list[dict[str, Any]] = [
        {**head, "seq": 0, "ts": started},
        {**entries.message(user(first)), "seq": 1, "ts": started},
    ]
    data = b"".join(orjson.dumps(line) + b"\n" for line in lines) + b"".join(extra_lines or [])
    path = folder / f"{session_id}.jsonl"
    path.write_bytes(data)
    return path


@dataclass
class Viewer:
    """A running standalone viewer and a client (with a cookie jar) pointed at it."""

    base: str
    client: aiohttp.ClientSession

    async def get(self, path: str, **kwargs: Any) -> tuple[int, str]:
        async with self.client.get(self.base + path, **kwargs) as resp:
            return resp.status, await resp.text()


@asynccontextmanager
async def serve(site: AdminSite) -> AsyncIterator[Viewer]:
    """Serve ``site`` standalone on 127.0.0.1, port 0, until the block ends."""
    runner = web.AppRunner(site.application(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    # unsafe=True: aiohttp's jar otherwise ignores cookies set by an IP-address host
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as client:
        try:
            yield Viewer(f"http://127.0.0.1:{port}", client)
        finally:
            await runner.cleanup()


def site_for(data_dir: Path, token: str | None = None, pinned: str | None = None,
             **kwargs: Any) -> AdminSite:
    return AdminSite(JsonlSessionStore(data_dir), Access(token, pinned=pinned), **kwargs)
