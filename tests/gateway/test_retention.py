"""Retention in the running gateway (``gateway/schedule/retention.py``), on a clock the test
moves: a pass at start and then one an hour; a session goes once its tenant's days have
passed since its last entry, then the files only it referred to; nothing runs when the
policy keeps everything."""

from __future__ import annotations

import time
from pathlib import Path

from gateway.edge.metrics import Metrics
from gateway.schedule.retention import EVERY, Retention
from sessions.attachments import BlobRef, ref_block
from sessions.blob_files import FileBlobStore
from sessions.jsonl import JsonlSessionStore
from sessions.retention import DAY, RetentionPolicy
from tests.fakes.clock import FakeClock
from tests.sessions.helpers import add, user


def removed(metrics: Metrics, kind: str) -> float | None:
    return metrics.registry.get_sample_value("gateway_retention_removed_total", {"kind": kind})


async def test_a_session_goes_once_its_days_have_passed_and_its_files_with_it(
        tmp_path: Path) -> None:
    """Seven days for every tenant: the passes at start and an hour later keep yesterday's
    session; the first pass more than seven days after its last entry removes it and the
    photo only it sent, and counts both."""
    store = JsonlSessionStore(tmp_path, durability="none")
    blobs = FileBlobStore(tmp_path)
    photo = await blobs.put("default", b"a photo")
    writer = await store.create(channel="web", conversation="web:c")
    await add(writer, {"role": "user", "content": [
        ref_block(BlobRef(photo, "p.png", "image/png", 7))]})
    await add(writer, user("and words"))
    await writer.aclose()
    clock, metrics = FakeClock(start=time.time()), Metrics()
    retention = Retention(RetentionPolicy(7), store, blobs, clock, metrics=metrics)
    async with retention:
        await clock.idle_after(0)  # the pass at start
        clock.advance(EVERY + 1)
        await clock.idle_after(1)
        kept = await store.list_sessions()
        clock.advance(7 * DAY)
        await clock.idle_after(2)
    assert len(kept) == 1
    assert await store.list_sessions() == []
    assert await blobs.list_blobs("default") == []
    assert (removed(metrics, "sessions"), removed(metrics, "blobs")) == (1, 1)


async def test_a_policy_that_keeps_everything_runs_no_pass(tmp_path: Path) -> None:
    """With no retention set, nothing waits on the clock and nothing is removed."""
    store = JsonlSessionStore(tmp_path, durability="none")
    writer = await store.create(channel="web", conversation="web:c")
    await writer.aclose()
    clock = FakeClock(start=time.time() + 10_000 * DAY)
    async with Retention(RetentionPolicy(), store, FileBlobStore(tmp_path), clock) as retention:
        assert not retention.running
    assert clock.rounds == 0
    assert len(await store.list_sessions()) == 1


async def test_a_pass_applies_each_tenants_days(tmp_path: Path) -> None:
    """T1 keeps one day, the rest thirty: two days on, T1's session is gone and the default
    tenant's is not."""
    store = JsonlSessionStore(tmp_path, durability="none")
    for tenant in ("default", "T1"):
        writer = await store.create(tenant=tenant, channel="web", conversation="web:c")
        await add(writer, user("hi"))
        await writer.aclose()
    retention = Retention(RetentionPolicy(30, {"T1": 1}), store, FileBlobStore(tmp_path),
                          FakeClock(start=time.time()))
    pruned, _ = await retention.apply(time.time() + 2 * DAY)
    assert [(p.tenant, p.kept) for p in pruned] == [("T1", None)]
    assert [i.tenant for i in await store.list_sessions()] == ["default"]
