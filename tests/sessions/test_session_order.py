"""A conversation's sessions are ordered as they were created, on every backend: by the header's
``generation``, not by start times that one millisecond, a clock stepping back or another
worker's clock can tie or invert; after a restart and across workers alike."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import orjson
import pytest

from sessions.jsonl import JsonlSessionStore
from sessions.names import utc_iso
from sessions.postgres.store import PostgresSessionStore
from sessions.store import SessionStore
from sessions.tombstones import tombstone
from tests.sessions.conftest import BACKENDS
from tests.sessions.pg import PG_URL
from tests.sessions.pg import connect as pg_connect

T = 1788253200.5  # 2026-09-01T09:00:00.500Z


class Clock:
    """A clock that says what the test sets."""

    def __init__(self, now: float = T) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


Worker = Callable[..., Awaitable[SessionStore]]
"""``await worker(clock)``: another store on the same data (a restart, or one more worker)."""


@pytest.fixture
async def opened() -> AsyncIterator[list[PostgresSessionStore]]:
    """PostgreSQL stores a test opened, closed after it (before its schema is dropped)."""
    stores: list[PostgresSessionStore] = []
    yield stores
    for store in stores:
        await store.aclose()


@pytest.fixture(params=BACKENDS)
def worker(request: pytest.FixtureRequest, tmp_path: Path) -> Worker:
    if request.param == "jsonl":
        async def jsonl(clock: Clock | None = None) -> SessionStore:
            return JsonlSessionStore(tmp_path / "data", durability="none",
                                     clock=clock or Clock())
        return jsonl
    schema: str = request.getfixturevalue("pg_schema_name")
    stores: list[PostgresSessionStore] = request.getfixturevalue("opened")

    async def postgres(clock: Clock | None = None) -> SessionStore:
        store = await PostgresSessionStore.connect(PG_URL, schema=schema,
                                                   clock=clock or Clock())
        stores.append(store)
        return store
    return postgres


async def create(store: SessionStore, sid: str, conversation: str = "c") -> None:
    writer = await store.create(tenant="default", channel="web", conversation=conversation,
                                session_id=sid)
    await writer.aclose()


async def generation(store: SessionStore, sid: str) -> object:
    return orjson.loads((await store.read_log("default", sid)).splitlines()[0]).get("generation")


async def plant_old(store: SessionStore, sid: str, conversation: str, started: float) -> None:
    """A session as gateways wrote them before generations: a header without one."""
    head = {"type": "session", "seq": 0, "ts": utc_iso(started), "version": 3, "id": sid,
            "startedAt": utc_iso(started), "channel": "web", "conversation": conversation,
            "tenant": "default"}
    data = orjson.dumps(head) + b"\n"
    if isinstance(store, JsonlSessionStore):
        path = store.path_of("default", sid)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    else:
        assert isinstance(store, PostgresSessionStore)
        await store.import_log("default", data)


async def test_sessions_started_in_one_millisecond_go_in_creation_order(worker: Worker) -> None:
    """Three sessions of a conversation started within one millisecond, each id sorting below
    the one before (``/new`` twice right after a first message): the last one created is the
    latest, for the store that made them and for a restarted one; generations 1, 2, 3."""
    store = await worker()
    for sid in ("c", "b", "a"):
        await create(store, sid)
    assert await store.latest_session("default", "c") == "a"
    restarted = await worker()
    assert await restarted.latest_session("default", "c") == "a"
    assert [await generation(restarted, sid) for sid in ("c", "b", "a")] == [1, 2, 3]
    assert [i.session_id for i in await restarted.list_sessions("default")] == ["a", "b", "c"]


async def test_a_clock_stepping_back_does_not_reorder_sessions(worker: Worker) -> None:
    """The clock steps back a second between two creations: the second is still the latest,
    before and after a restart."""
    clock = Clock(T + 1)
    store = await worker(clock)
    await create(store, "s1")
    clock.now = T
    await create(store, "s2")
    assert await store.latest_session("default", "c") == "s2"
    assert await (await worker()).latest_session("default", "c") == "s2"


async def test_workers_with_skewed_clocks_agree_on_the_latest(worker: Worker) -> None:
    """Worker A, its clock 250 ms ahead, starts the session; worker B takes the conversation
    over and rotates it: B, and a worker started afterwards, both continue in B's session."""
    a = await worker(Clock(T + 0.25))
    await create(a, "b-first")
    b = await worker(Clock(T))
    await create(b, "a-second")
    assert await b.latest_session("default", "c") == "a-second"
    assert await (await worker()).latest_session("default", "c") == "a-second"


async def test_sessions_from_before_generations_resolve_as_before(worker: Worker) -> None:
    """Sessions whose headers have no generation are ordered by start time, then id, as they
    always were; a session created after them is the latest however early its clock says it
    started, and is its conversation's generation 1."""
    store = await worker(Clock(T - 60))
    await plant_old(store, "o1", "c", T + 2)
    await plant_old(store, "o2", "c", T + 1)
    await plant_old(store, "o3", "d", T)
    await plant_old(store, "o4", "d", T)
    assert [await store.latest_session("default", conv) for conv in ("c", "d")] == ["o1", "o4"]
    await create(store, "n", "c")
    assert await store.latest_session("default", "c") == "n"
    assert await generation(store, "n") == 1
    restarted = await worker()
    assert [await restarted.latest_session("default", conv) for conv in ("c", "d")] == [
        "n", "o4"]


async def test_erasing_the_latest_falls_back_to_the_one_created_before(worker: Worker) -> None:
    """Of three sessions started in one millisecond, the latest is erased: the one created
    before it is the latest now, and a session created next comes after it."""
    store = await worker()
    for sid in ("c", "b", "a"):
        await create(store, sid)
    stone = tombstone(tenant="default", kind="person", channel="web", ident="u1",
                      requested_by="operator", sessions=["a"], removed={"session": 1})
    assert await store.erase("default", ["a"], stone) == ["a"]
    assert await store.latest_session("default", "c") == "b"
    assert await (await worker()).latest_session("default", "c") == "b"
    await create(store, "0")
    assert (await store.latest_session("default", "c"), await generation(store, "0")) == ("0", 3)


@pytest.mark.parametrize("worker", ["jsonl"], indirect=True)
async def test_overlapping_creations_are_numbered_in_call_order(worker: Worker) -> None:
    """Two creations of one conversation at once in one store (one millisecond): each comes
    after the one called before it, though neither had finished when the other began."""
    store = await worker()
    await create(store, "z")
    await asyncio.gather(create(store, "y"), create(store, "x"))
    assert {sid: await generation(store, sid) for sid in ("z", "y", "x")} == {
        "z": 1, "y": 2, "x": 3}
    assert await store.latest_session("default", "c") == "x"
    assert await (await worker()).latest_session("default", "c") == "x"


@pytest.mark.services
async def test_creations_on_two_workers_take_turns(pg_schema_name: str,
                                                   opened: list[PostgresSessionStore]) -> None:
    """Two workers create a session of one conversation at once: both have read the sessions
    table before either could insert (the test holds inserts back until both wait), yet the
    second counts on from the first's session: generations 2 and 3, the latest is the 3."""
    for clock in (Clock(), Clock()):
        opened.append(await PostgresSessionStore.connect(PG_URL, schema=pg_schema_name,
                                                         clock=clock))
    a, b = opened
    await create(a, "first")
    admin = await pg_connect()
    try:
        async with admin.transaction():
            await admin.execute(f"LOCK TABLE {pg_schema_name}.sessions IN EXCLUSIVE MODE")
            both = asyncio.gather(create(a, "x"), create(b, "y"))
            waiting = 0
            for _ in range(400):  # until both creations wait on a lock (20 s at most)
                # pg_stat_activity is read once per transaction and kept until its end (or
                # until this call): without it every poll saw the first one's count.
                await admin.execute("SELECT pg_stat_clear_snapshot()")
                waiting = await admin.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND position($1 IN query) > 0", pg_schema_name)
                if waiting >= 2 or both.done():
                    break
                await asyncio.sleep(0.05)
        await both
    finally:
        await admin.close()
    assert waiting == 2
    numbers = {sid: await generation(a, sid) for sid in ("first", "x", "y")}
    assert sorted(numbers.values()) == [1, 2, 3]
    last = max(numbers, key=lambda sid: numbers[sid])
    assert [await s.latest_session("default", "c") for s in (a, b)] == [last, last]


async def test_listing_keeps_a_conversations_sessions_in_creation_order(worker: Worker) -> None:
    """Newest first: a conversation's sessions keep creation order among the places their
    start times gave them, other conversations' sessions stay where their times put them."""
    clock = Clock(T + 2)
    store = await worker(clock)
    await create(store, "s1")
    clock.now = T + 1
    await create(store, "x", "other")
    clock.now = T
    await create(store, "s2")
    listed = [(i.session_id, i.generation) for i in await store.list_sessions("default")]
    assert listed == [("s2", 2), ("x", 1), ("s1", 1)]
