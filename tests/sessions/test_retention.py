"""Retention (``sessions/retention.py`` and each store's ``prune``): days per tenant, the
sessions older than their tenant's cutoff removed on both stores (and only those), a dry run
that changes nothing, a session a writer holds kept, then the blobs no kept session refers to."""

from __future__ import annotations

import os
import time

import pytest

from sessions.attachments import BlobRef, ref_block
from sessions.blob_files import FileBlobStore
from sessions.blobs import BlobStore
from sessions.jsonl import JsonlSessionStore
from sessions.postgres.blobs import PostgresBlobStore
from sessions.postgres.store import PostgresSessionStore
from sessions.retention import DAY, RetentionPolicy, keep_seconds, prune_blobs
from sessions.store import Cutoffs, SessionStore
from tests.sessions.helpers import add, user


def test_a_policy_gives_each_tenant_its_days_and_its_cutoff() -> None:
    """A tenant of its own gets its days (0: forever), every other the default; the cutoff
    is that many days before now; shorter-lived records keep the shorter of the two."""
    policy = RetentionPolicy.parse(30, "T1=7, T2=0")
    assert (policy.days("T1"), policy.days("T2"), policy.days("T9")) == (7, None, 30)
    cutoffs = policy.cutoffs(1000 * DAY)
    assert (cutoffs("T1"), cutoffs("T2"), cutoffs("T9")) == (993 * DAY, None, 970 * DAY)
    assert policy.any
    assert not RetentionPolicy.parse(0, "").any
    assert RetentionPolicy.parse(0, "T1=2").any
    assert keep_seconds(policy, "T1", 3 * DAY) == 3 * DAY
    assert keep_seconds(RetentionPolicy.parse(1, ""), "T1", 3 * DAY) == DAY
    assert keep_seconds(policy, "T2", 3 * DAY) == 3 * DAY
    for bad in ("T1", "T1=-1", "T1=x", "=3"):
        with pytest.raises(ValueError, match="tenant=days"):
            RetentionPolicy.parse(0, bad)


async def aged(store: SessionStore, tenant: str, name: str, days_ago: float) -> str:
    """A session of ``tenant`` whose last entry was ``days_ago`` days ago."""
    writer = await store.create(tenant=tenant, channel="web", conversation=f"web:{name}")
    await add(writer, user(f"hello from {name}"))
    await writer.aclose()
    when = time.time() - days_ago * DAY
    if isinstance(store, JsonlSessionStore):
        os.utime(store.path_of(tenant, writer.session_id), (when, when))
    else:
        assert isinstance(store, PostgresSessionStore)
        async with store.connection() as conn:
            await conn.execute(f"UPDATE {store.quoted_schema}.sessions SET modified_at ="
                               " to_timestamp($2) WHERE id = $1", writer.session_id, when)
    return writer.session_id


async def test_sessions_older_than_their_tenants_cutoff_go_and_no_other(
        store: SessionStore) -> None:
    """Default 10 days, T1 1 day, T2 forever: a 20-day-old default session, a 3-day-old T1
    one go; a 5-day-old default one, a 12-hour-old T1 one and a 400-day-old T2 one stay. A
    dry run names the same ones and removes nothing."""
    old = await aged(store, "default", "old", 20)
    await aged(store, "default", "recent", 5)
    t1_old = await aged(store, "T1", "t1old", 3)
    await aged(store, "T1", "t1new", 0.5)
    await aged(store, "T2", "forever", 400)
    now = time.time()
    cutoffs = Cutoffs(now - 10 * DAY, {"T1": now - DAY, "T2": None})
    dry = await store.prune(cutoffs, dry=True)
    assert sorted((p.tenant, p.session_id, p.kept) for p in dry) == sorted(
        [("default", old, None), ("T1", t1_old, None)])
    assert len(await store.list_sessions()) == 5
    done = await store.prune(cutoffs)
    assert sorted((p.tenant, p.session_id) for p in done) == sorted(
        [("default", old), ("T1", t1_old)])
    left = {(i.tenant, i.conversation) for i in await store.list_sessions()}
    assert left == {("default", "web:recent"), ("T1", "web:t1new"), ("T2", "web:forever")}
    assert await store.prune(cutoffs) == []


async def test_a_session_a_writer_holds_is_kept(jsonl_store: JsonlSessionStore) -> None:
    """A JSONL session whose writer is open (its lock) stays, and says why."""
    sid = await aged(jsonl_store, "default", "held", 20)
    writer = await jsonl_store.open("default", sid)
    try:
        os.utime(jsonl_store.path_of("default", sid), (0, 0))  # the open touched it
        [kept] = await jsonl_store.prune(Cutoffs(time.time() - DAY))
    finally:
        await writer.aclose()
    assert (kept.session_id, kept.kept) == (sid, "in use by a running gateway")
    assert await jsonl_store.exists("default", sid)


@pytest.fixture
def blobs(store: SessionStore) -> BlobStore:
    if isinstance(store, JsonlSessionStore):
        return FileBlobStore(store.data_dir)
    assert isinstance(store, PostgresSessionStore)
    return PostgresBlobStore(store)


async def test_after_the_sessions_the_blobs_only_they_referred_to_go(
        store: SessionStore, blobs: BlobStore) -> None:
    """A removed session's own photo goes; one a kept session also sent stays, and so does
    every blob of a tenant not asked about."""
    own = await blobs.put("default", b"only the old session's")
    shared = await blobs.put("default", b"both sessions'")
    other = await blobs.put("T9", b"another tenant's, unreferenced")
    sessions = {}
    for name, files in (("old", (own, shared)), ("new", (shared,))):
        writer = await store.create(channel="web", conversation=f"web:{name}")
        await add(writer, {"role": "user", "content": [
            ref_block(BlobRef(d, "f.png", "image/png", 9)) for d in files]})
        await writer.aclose()
        sessions[name] = writer.session_id
    old = sessions["old"]
    when = time.time() - 20 * DAY
    if isinstance(store, JsonlSessionStore):
        os.utime(store.path_of("default", old), (when, when))
    else:
        assert isinstance(store, PostgresSessionStore)
        async with store.connection() as conn:
            await conn.execute(f"UPDATE {store.quoted_schema}.sessions SET modified_at ="
                               " to_timestamp($2) WHERE id = $1", old, when)
    later = time.time() + 2 * 3600  # past the grace given to files just stored
    dry = await prune_blobs([store], blobs, ["default"], now=later, dry=True,
                            gone=Cutoffs(time.time() - 10 * DAY))
    assert [b.hash for _, b in dry.removed] == [own]
    assert len(await blobs.list_blobs("default")) == 2
    await store.prune(Cutoffs(time.time() - 10 * DAY))
    done = await prune_blobs([store], blobs, ["default"], now=later)
    assert [b.hash for _, b in done.removed] == [own]
    assert {b.hash for b in await blobs.list_blobs("default")} == {shared}
    assert {b.hash for b in await blobs.list_blobs("T9")} == {other}
    await blobs.aclose()
