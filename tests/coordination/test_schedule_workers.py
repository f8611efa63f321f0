"""Two ``gateway run`` workers on PostgreSQL and Redis fire 200 due occurrences exactly once
each: owed once (the inbox), recorded once and answered once (the logs), also when one
worker is SIGKILLed while it is firing them."""

from __future__ import annotations

import asyncio
import random
import re
import time
from pathlib import Path

import aiohttp
import asyncpg
import orjson
import pytest

from sessions.postgres.schedules import PostgresScheduleStore
from sessions.postgres.store import PostgresSessionStore
from sessions.schedules import ScheduleRecord, Target
from tests.coordination.cluster import (
    ChatClient,
    Sent,
    WorkerProcess,
    start_workers,
    stop_workers,
)
from tests.sessions.pg import PG_URL
from tests.waiting import until
from tests.web_ids import WEB_TENANT, client_label

pytestmark = [pytest.mark.services, pytest.mark.timeout(600)]

OCCURRENCES = 200
CONVERSATIONS = 20
FIRED = re.compile(r"schedule (s\d{3}) \(tenant web\): fired")


def schedule(n: int, now: float, chats: dict[str, str]) -> ScheduleRecord:
    """Occurrence ``n`` to the web conversation ``c<n % 20>`` (``chats``: the gateway's name
    of each, under the person who talked in it)."""
    chat = chats[f"c{n % CONVERSATIONS:02d}"]
    return ScheduleRecord(
        id=f"s{n:03d}", tenant=WEB_TENANT, owner="tenant",
        target=Target("web", chat, "private", None, chat.partition(".")[0]), trigger="at",
        spec=repr(now - 1),
        zone="UTC", instruction=f"say the word number {n}", created_by="operator",
        created_at=now - 2, next_at=now - 1)


def fired_in(worker: WorkerProcess) -> list[str]:
    text = worker.log.read_bytes()[worker.log_from:].decode(errors="replace")
    return FIRED.findall(text)


async def talk_first(workers: list[WorkerProcess], store: PostgresSessionStore) -> dict[str, str]:
    """Each conversation talks to the bot once (a web chat is written to only then); the
    gateway's name of each (``<person>.<id>``), by the id the client sent."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        client = ChatClient(http, workers, random.Random(3).choice)
        sent = [Sent(f"c{c:02d}", f"hello-{c}", "hello") for c in range(CONVERSATIONS)]
        async with asyncio.TaskGroup() as group:
            for one in sent:
                group.create_task(client.send(one, asyncio.Event()))
    assert all(s.reply is not None for s in sent)
    return {client_label(info.conversation).removeprefix("web:"):
            (info.conversation or "").removeprefix("web:")
            for info in await store.list_sessions(WEB_TENANT)}


async def wait_all_answered(schema: str) -> list[asyncpg.Record]:
    """The inbox rows of scheduled items, once all are owed and answered."""
    conn = await asyncpg.connect(PG_URL)
    try:
        async with asyncio.timeout(240):
            while True:
                rows = await conn.fetch(
                    f'SELECT dedup, answered_at, session_id FROM "{schema}".inbox'
                    " WHERE dedup LIKE '%:schedule:%'")
                if len(rows) >= OCCURRENCES and all(r["answered_at"] for r in rows):
                    return rows
                await asyncio.sleep(0.2)
    finally:
        await conn.close()


@pytest.mark.parametrize("kill", [False, True], ids=["both-live", "one-killed-while-firing"])
async def test_two_workers_fire_200_due_occurrences_exactly_once(
        prefix: str, schema: str, pg_store: PostgresSessionStore, tmp_path: Path,
        kill: bool) -> None:
    """200 due occurrences over 20 web conversations, two workers (one SIGKILLed after its
    first firing, when asked): each occurrence is owed once, its trigger recorded once and
    answered once, and every schedule says it fired once."""
    workers = await start_workers(2, tmp=tmp_path, schema=schema, prefix=prefix, extra={
        "GATEWAY_LOG_LEVELS": "gateway.schedule=INFO", "GATEWAY_SCHEDULE_POLL": "0.2",
        "GATEWAY_SCHEDULE_BATCH": "5"})
    victim = workers[0]
    try:
        chats = await talk_first(workers, pg_store)
        store = PostgresScheduleStore(pg_store)
        now = time.time()
        for n in range(OCCURRENCES):
            await store.add(schedule(n, now, chats), per_owner=0, per_tenant=0)
        if kill:
            await until(lambda: fired_in(victim), 120, "the schedule to fire in the victim")
            victim.proc.kill()
            await victim.proc.wait()
        rows = await wait_all_answered(schema)
        records = await store.find(WEB_TENANT, active_only=False)
    finally:
        await stop_workers(workers)

    dedups = sorted(r["dedup"] for r in rows)
    assert len(dedups) == len(set(dedups)) == OCCURRENCES
    assert {(r.id, r.state, r.fired, r.skipped) for r in records if r.id.startswith("s")} == \
        {(f"s{n:03d}", "done", 1, 0) for n in range(OCCURRENCES)}
    triggers: dict[str, int] = {}
    for info in await pg_store.list_sessions(WEB_TENANT):
        lines = (await pg_store.read_log(WEB_TENANT, info.session_id)).splitlines()
        entries = [orjson.loads(line) for line in lines]
        for i, entry in enumerate(entries):
            meta = entry.get("meta") or {}
            if entry.get("type") == "message" and "scheduled" in meta:
                ident = meta["scheduled"]["schedule"]
                triggers[ident] = triggers.get(ident, 0) + 1
                answers = [e for e in entries[i + 1:] if e.get("type") == "message"
                           and e["message"]["role"] == "assistant"]
                assert answers, f"{ident} has no answer"
    assert triggers == {f"s{n:03d}": 1 for n in range(OCCURRENCES)}
    if kill:
        assert victim.proc.returncode == -9
        assert fired_in(victim)
        assert fired_in(workers[1])
