"""The duplicate check's memory in one process is bounded by bytes (issue 31 item 4): what an
entry weighs, the cap holding under a day of traffic (fake clock), redeliveries inside what is
kept still refused, and at the cap the oldest forgotten first, counted, logged and reported."""

from __future__ import annotations

import logging
import sys
import tracemalloc
from pathlib import Path

import orjson
import pytest

from app.compose import build_coordinator
from app.config import Settings
from coordination.journal import FileJournal
from coordination.local import InProcessCoordinator, LocalConversations
from coordination.seen_keys import ENTRY_BYTES, SESSION_BYTES, SeenKeys, digest
from gateway.edge.coordination import new_item_id
from sessions.jsonl import JsonlSessionStore
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.harness import running_core

HOUR = 3600.0
DAY_TTL = 25 * HOUR


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_an_entry_weighs_no_more_than_it_is_counted() -> None:
    """20,000 answered keys of the gateway's shapes (tenant:channel:chat:platform id, 16-hex
    item ids, 200 sessions) hold no more memory, measured by tracemalloc, than the bytes the
    structure counts for them, which is what the cap compares."""
    keys = [f"default:telegram:{n % 200}:{1_000_000 + n}" for n in range(20_000)]
    items = [new_item_id() for _ in keys]
    sessions = [f"20261206-084100-{n:08x}-session" for n in range(200)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        seen = SeenKeys(1 << 30)
        for n, key in enumerate(keys):
            seen.add(digest(key), items[n], float(n), sessions[n % 200], ttl=DAY_TTL,
                     now=float(n))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert seen.approx_bytes == 20_000 * ENTRY_BYTES + sum(
        SESSION_BYTES + sys.getsizeof(s) for s in sessions)
    assert held <= seen.approx_bytes
    assert held >= 20_000 * 120  # the figures are not padded past sense either
    remembered = seen.get(digest(keys[7]))
    assert remembered is not None
    assert (remembered.item, remembered.session, remembered.at) == (items[7], sessions[7], 7.0)


async def test_the_cap_holds_through_a_day_and_keeps_the_newest(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A message every 4 s for 30 hours against a cap of 1,000 entries' worth: the bytes and
    entries held never pass the cap; what is kept is the newest (their redeliveries are
    duplicates with their item and session); what was forgotten early is counted, its reach
    reported, and logged once an hour, not once a message; after a restart the same holds."""
    clock = Clock()
    cap = 1_000 * ENTRY_BYTES + SESSION_BYTES + 100  # one session, "s"
    path = tmp_path / "delivery.jsonl"
    journal = FileJournal(path, clock=clock, fsync="none", max_seen_bytes=cap)
    await journal.open()
    caplog.set_level(logging.WARNING, logger="coordination.journal")
    most = 0
    total = int(30 * HOUR / 4)
    for n in range(total):
        clock.now += 4.0
        await journal.owe(f"{n:016x}", "c", f"t:web:c:{n}", "body")
        await journal.paid(f"{n:016x}", "s")
        if journal.compacting is not None:
            await journal.compacting
        most = max(most, journal.seen_keys.approx_bytes)
    assert most <= cap
    assert len(journal.seen_keys) == 1_000
    newest = total - 1
    assert journal.seen(f"t:web:c:{newest}") == (f"{newest:016x}", "s")
    assert journal.seen(f"t:web:c:{total - 1_000}") == (f"{total - 1_000:016x}", "s")
    # Forgotten at the cap, well inside its 25 h: the documented cost (received as new).
    assert journal.seen(f"t:web:c:{total - 1_001}") is None
    health = journal.dedup_health()
    assert health["evicted_early"] == total - 1_000
    assert health["reach_seconds"] == pytest.approx(999 * 4.0, abs=4.0)
    warnings = [r for r in caplog.records if "memory cap" in r.getMessage()]
    assert 28 <= len(warnings) <= 30  # the first at the cap (1.1 h in), then once an hour
    assert "1.1 h of answered messages" in warnings[-1].getMessage()
    journal.close()

    again = FileJournal(path, clock=clock, fsync="none", max_seen_bytes=cap)
    await again.open()
    assert len(again.seen_keys) == 1_000
    assert again.seen(f"t:web:c:{newest}") == (f"{newest:016x}", "s")
    raw = path.read_bytes()
    assert b"t:web:c:" not in raw  # the platform ids are kept as digests only
    rewritten = [orjson.loads(line) for line in raw.splitlines()]
    assert {line[0] for line in rewritten} == {"seen#"}
    assert [line[2] for line in rewritten] == [f"{n:016x}" for n in range(total - 1_000, total)]
    again.close()


async def test_without_the_cap_keys_last_their_ttl(tmp_path: Path) -> None:
    """Under the cap nothing is forgotten early: a redelivery 24 h later is a duplicate, one
    25 h later is not (the ttl, as before), and health says the full ttl is covered."""
    clock = Clock()
    journal = FileJournal(tmp_path / "delivery.jsonl", clock=clock, fsync="none")
    await journal.open()
    await journal.owe("00000000000000aa", "c", "t:web:c:1", "body")
    await journal.paid("00000000000000aa", "s")
    clock.now += 24 * HOUR
    assert journal.seen("t:web:c:1") == ("00000000000000aa", "s")
    assert journal.dedup_health()["reach_seconds"] is None
    assert journal.dedup_health()["evicted_early"] == 0
    clock.now += HOUR
    assert journal.seen("t:web:c:1") is None
    journal.close()


async def test_a_journal_of_the_earlier_format_is_read(tmp_path: Path) -> None:
    """``seen`` lines holding the platform key itself (files written before the digests) are
    remembered on start, and rewritten as digests."""
    clock = Clock()
    path = tmp_path / "delivery.jsonl"
    path.parent.mkdir(mode=0o700, exist_ok=True)
    path.write_bytes(orjson.dumps(["seen", "t:web:c:9", "item-9", "s", clock.now]) + b"\n")
    path.chmod(0o600)
    journal = FileJournal(path, clock=clock, fsync="none")
    await journal.open()
    assert journal.seen("t:web:c:9") == ("item-9", "s")
    assert [orjson.loads(line)[0] for line in path.read_bytes().splitlines()] == ["seen#"]
    journal.close()


async def test_redeliveries_through_the_router_at_the_cap(tmp_path: Path) -> None:
    """End to end, one process with a cap of 20 entries: a redelivery of a recent message is
    refused as a duplicate (one answer), and one of a message the cap forgot is answered a
    second time: the cost the cap's docs state, visible in health's ``evicted_early``."""
    journal = FileJournal(tmp_path / "state" / "delivery.jsonl",
                          max_seen_bytes=20 * ENTRY_BYTES + SESSION_BYTES + 150)
    conversations = LocalConversations(journal)
    provider = ScriptedProvider()
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p",
                            conversations=conversations) as core:
        for n in range(30):
            await core.channel.say("a", f"m{n}", platform_id=f"p{n}")
        await core.channel.wait_replies(30)
        recent = await core.channel.say("a", "m29", platform_id="p29")
        old = await core.channel.say("a", "m0", platform_id="p0")
        await core.channel.wait_replies(31)
        await core.idle()  # every turn has ended: a further answer would be out by now
    assert recent is not None
    assert recent.duplicate
    assert old is not None
    assert not old.duplicate
    assert len(core.channel.replies) == 31
    assert journal.dedup_health()["evicted_early"] == 11  # 30 + the old one again, 20 kept


def test_the_setting_reaches_the_journal_and_health(tmp_path: Path) -> None:
    """``GATEWAY_DEDUP_MEMORY`` is the cap of the one-process coordinator's journal, and its
    ``/healthz`` section reports the check's keys, bytes and cap."""
    settings = Settings(_env_file=None, GATEWAY_DATA_DIR=str(tmp_path),  # type: ignore[call-arg]
                        GATEWAY_DEDUP_MEMORY="1048576")
    coordinator = build_coordinator(settings)
    assert isinstance(coordinator, InProcessCoordinator)
    assert coordinator.health()["dedup"] == {
        "keys": 0, "bytes": 0, "max_bytes": 1_048_576, "evicted_early": 0,
        "reach_seconds": None}
