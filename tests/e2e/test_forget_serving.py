"""``gateway forget --user`` run (a subprocess) while ``gateway run`` serves (subprocesses
too), on the JSONL store, on PostgreSQL, and with two workers sharing PostgreSQL and Redis:
the command exits 0, the erased person's next message is answered in a fresh session whose
recorded call carries nothing of theirs, another person's memory is intact, and afterwards no
file under the data folders and no row of the database holds the erased text or file bytes.
"""

from __future__ import annotations

import asyncio
import base64
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson
import pytest

from sessions.postgres import schema as pg_schema
from sessions.replay import replay_bytes
from tests.coordination.cluster import start_workers, stop_workers
from tests.coordination.services import delete_prefix, new_prefix, redis_client
from tests.fakes import media
from tests.ports import free_port
from tests.reliability.crash_harness import GatewayProcess
from tests.sessions.pg import PG_URL, fresh_schema

ROOT = Path(__file__).resolve().parents[2]
SECRET = "zanzibar7"
"""What the erased person told the bot: it must be nowhere afterwards."""
PHOTO = media.jpeg(40, 30, noise=True, seed=4242)
ADA, BOB = "ada-conv", "bob-conv"


@dataclass
class Deployment:
    """Where the gateways listen, what ``gateway forget`` runs with, what to search after."""

    bases: list[str]
    env: dict[str, str]
    cwd: Path
    data_dirs: list[Path]
    persona: Path
    schema: str | None = None
    logs: list[Path] = field(default_factory=list)


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update({"GATEWAY_CHANNELS": "web", "GATEWAY_PROVIDER": "offline",
                "GATEWAY_HOST": "127.0.0.1", "GATEWAY_LOG_LEVEL": "INFO",
                "GATEWAY_SHUTDOWN_GRACE": "2", "PYTHONPATH": str(ROOT)})
    return env


@asynccontextmanager
async def one_gateway(tmp: Path, schema: str | None) -> AsyncIterator[Deployment]:
    """``gateway run`` alone over ``tmp/data`` (PostgreSQL sessions when ``schema``)."""
    data = tmp / "data"
    env = {**base_env(), "GATEWAY_DATA_DIR": str(data)}
    if schema is not None:
        env.update({"GATEWAY_STORE_URL": PG_URL, "GATEWAY_STORE_SCHEMA": schema})
    port = free_port()
    env["GATEWAY_PORT"] = str(port)
    process = GatewayProcess(env, tmp, tmp, port)
    await process.start()
    try:
        yield Deployment([process.base], process.env, tmp, [data], data / "persona", schema,
                         [process.log])
    finally:
        await process.stop()


@asynccontextmanager
async def two_workers(tmp: Path, schema: str) -> AsyncIterator[Deployment]:
    """Two ``gateway run`` workers sharing the schema and a Redis prefix of their own."""
    client = await redis_client()
    prefix = new_prefix()
    workers = await start_workers(2, tmp=tmp, schema=schema, prefix=prefix, lease_ttl=3.0,
                                  extra={"GATEWAY_LOG_LEVEL": "INFO"})
    try:
        yield Deployment([w.base for w in workers], {**workers[0].env}, tmp,
                         [tmp / "w0", tmp / "w1"], tmp / "persona", schema,
                         [w.log for w in workers])
    finally:
        await stop_workers(workers)
        await delete_prefix(client, prefix)
        await client.aclose()


async def chat(http: aiohttp.ClientSession, base: str, conversation: str, text: str,
               *, photo: bytes | None = None) -> dict[str, Any]:
    """One web message, answered (the response carries the reply)."""
    body: dict[str, Any] = {"conversation": conversation, "text": text}
    if photo is not None:
        body["attachments"] = [{"name": "me.jpg", "media_type": "image/jpeg",
                                "data": base64.b64encode(photo).decode()}]
    async with http.post(f"{base}/api/chat", json=body,
                         timeout=aiohttp.ClientTimeout(total=120)) as response:
        answer = await response.json()
        assert response.status == 200, answer
        return dict(answer)


async def forget(deployment: Deployment, user: str, tenant: str) -> tuple[int, str, str]:
    """``python -m gateway forget`` as an operator runs it, with the gateway's settings."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "forget", "--user", user, "--tenant", tenant,
        cwd=deployment.cwd, env=deployment.env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(300):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def logs_of(deployment: Deployment) -> dict[str, bytes]:
    """Every session log (id -> bytes), from the files or the database."""
    if deployment.schema is None:
        found: dict[str, bytes] = {}
        for data in deployment.data_dirs:
            for path in data.glob("**/sessions/*.jsonl"):
                found[path.stem] = path.read_bytes()
        return found
    conn = await asyncpg.connect(PG_URL)
    try:
        q = pg_schema.quoted(deployment.schema)
        rows = await conn.fetch(f"SELECT session_id, string_agg(line, '\\x0a'::bytea ORDER BY"
                                f" seq) AS log FROM {q}.entries GROUP BY session_id")
    finally:
        await conn.close()
    return {str(r["session_id"]): bytes(r["log"]) + b"\n" for r in rows}


def scope_of(log: bytes) -> tuple[str, str]:
    """(tenant, person id) of a one-to-one session, from its header."""
    head = orjson.loads(log.split(b"\n", 1)[0])
    return str(head["tenant"]), str(head["scope"]["id"])


def needles() -> list[bytes]:
    """The erased text and file, in every form a file or a row could hold them."""
    return [SECRET.encode(), SECRET.encode().hex().encode(), PHOTO[:64],
            base64.b64encode(PHOTO)[:64], PHOTO[:64].hex().encode()]


def files_holding(roots: list[Path]) -> list[str]:
    found = []
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                if any(n in data for n in needles()):
                    found.append(str(path.relative_to(root.parent)))
    return found


async def rows_holding(schema: str) -> list[str]:
    """Every row of every table of the schema, as text (bytea as hex), searched."""
    conn = await asyncpg.connect(PG_URL)
    found = []
    try:
        tables = await conn.fetch("SELECT table_name FROM information_schema.tables"
                                  " WHERE table_schema = $1", schema)
        q = pg_schema.quoted(schema)
        for table in tables:
            name = str(table["table_name"])
            for row in await conn.fetch(f'SELECT t::text AS row FROM {q}."{name}" t'):
                text = str(row["row"]).encode()
                if any(n in text for n in needles()):
                    found.append(f"{name}: {text[:120]!r}")
    finally:
        await conn.close()
    return found


async def scenario(deployment: Deployment) -> None:
    """The person's data, forget while serving, then every check of the module docstring."""
    first, other = deployment.bases[0], deployment.bases[-1]
    # Two browsers: each is the person of the identity cookie its chat page set.
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http, \
            aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as bob:
        for browser, base in ((http, first), (bob, other)):
            async with browser.get(f"{base}/") as page:
                assert page.status == 200
        await chat(http, first, ADA, f"remember that my secret word is {SECRET}")
        await chat(http, first, ADA, "here is my photo", photo=PHOTO)
        await chat(bob, other, BOB, "remember that I like coffee")
        logs = await logs_of(deployment)
        [ada_log] = [log for log in logs.values() if SECRET.encode() in log]
        tenant, person = scope_of(ada_log)
        [bob_log] = [log for log in logs.values() if b"I like coffee" in log]
        bob_person = scope_of(bob_log)[1]

        code, out, err = await forget(deployment, f"web:{person}", tenant)
        assert (code, err) == (0, ""), (out, err)
        kinds = [line.split()[0] for line in out.splitlines()[1:-1]]
        assert {"memory", "session", "blob"} <= set(kinds), out
        assert out.splitlines()[-1].startswith("tombstone recorded (")

        # The worker that had the person's conversation cached answers them again.
        again = await chat(http, first, ADA, "hello again")
        # The other person is untouched: answered in the same session, history intact.
        bob_again = await chat(bob, other, BOB, "still there?")
        async with bob.get(f"{other}/api/history", params={"conversation": BOB}) as response:
            assert response.status == 200
            bob_history = await response.json()
    assert bob_again["session"] == orjson.loads(bob_log.split(b"\n", 1)[0])["id"]
    assert [m["text"] for m in bob_history["messages"]
            if m["role"] == "user" and m["text"] is not None] == [
        "remember that I like coffee", "still there?"]
    assert SECRET not in again["reply"]
    logs = await logs_of(deployment)
    assert not [sid for sid, log in logs.items() if SECRET.encode() in log]
    assert again["session"] != orjson.loads(ada_log.split(b"\n", 1)[0])["id"]
    fresh = replay_bytes(logs[again["session"]])
    [turn] = fresh.calls
    assert turn.rebuildable
    assert turn.prompt is not None
    assert SECRET not in (turn.prompt.text or "")
    assert [m["content"] for m in fresh.sent(turn)] == ["hello again"]
    memory = deployment.persona / "memory" / tenant / "web" / "people"
    assert (memory / bob_person / "MEMORY.md").read_text() == "I like coffee\n"
    assert not (memory / person).exists()
    assert files_holding([*deployment.data_dirs, deployment.persona]) == []
    if deployment.schema is not None:
        assert await rows_holding(deployment.schema) == []


async def test_forget_while_one_gateway_serves_jsonl(tmp_path: Path) -> None:
    """JSONL store, one ``gateway run``: the CLI hands the erasure to it over its control
    socket; every check of the module docstring holds (the owed journal included)."""
    async with one_gateway(tmp_path, None) as deployment:
        await scenario(deployment)


@pytest.mark.services
async def test_forget_while_one_gateway_serves_postgres(tmp_path: Path) -> None:
    """PostgreSQL store, one ``gateway run`` (its owed journal in the data folder): the same,
    and no row of any table holds the erased text or photo."""
    async with fresh_schema() as schema, one_gateway(tmp_path, schema) as deployment:
        await scenario(deployment)


@pytest.mark.services
async def test_forget_while_two_workers_serve(tmp_path: Path) -> None:
    """Two workers on PostgreSQL and Redis: the CLI holds both still over Redis, erases, and
    the worker that had cached the person's conversation answers them in a fresh one; the
    inbox rows and blobs of theirs are gone from the database."""
    async with fresh_schema() as schema, two_workers(tmp_path, schema) as deployment:
        await scenario(deployment)
        for log in deployment.logs:  # each worker held still for the command's erasure
            assert "erasure: holding the web conversations" in log.read_text(errors="replace")
