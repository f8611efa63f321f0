"""The SessionStore contract, run against every backend (JSONL files and PostgreSQL)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from sessions import entries
from sessions.erased import marker_line
from sessions.errors import (
    InvalidNameError,
    SessionExistsError,
    SessionNotFoundError,
)
from sessions.jsonl import JsonlSessionStore
from sessions.persist import persist_call, record_outcome
from sessions.postgres.store import PostgresSessionStore
from sessions.records import Outcome
from sessions.replay import replay_bytes
from sessions.replay_json import replay_json
from sessions.store import SessionStore
from sessions.tombstones import tombstone
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
from tests.waiting import next_millisecond

BAD_NAMES: list[Any] = ["..", "../x", "a/b", "", "a" * 200, ".hidden", "a\x00b", 5, b"s1"]


def names_under(path: Path) -> list[str]:
    """Every path below ``path``, relative, sorted (what a test left on disk)."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


async def conversation(store: SessionStore, session_id: str = "s1") -> None:
    """A two-call session with a tool round, a prompt change and outcomes, closed."""
    writer = await store.create(tenant="default", channel="console", conversation="c",
                                session_id=session_id)
    await add(writer, user("what time is it?"))
    await persist_call(writer, call_request(PROMPT_A, ((0, 1),)))
    await add(writer, tool_use("t1", "get_time", {"tz": "UTC"}), tool_result("t1", "12:00"))
    await record_outcome(writer, Outcome(call=0, stop_reason="tool_use"))
    await persist_call(writer, call_request(PROMPT_B, ((0, 3),), reason="rebuilt", tools=TOOLS_B))
    await add(writer, assistant("noon"))
    await record_outcome(writer, Outcome(call=1, stop_reason="end_turn"))
    await writer.sync()
    await writer.aclose()


def without_times(data: bytes) -> bytes:
    """The log's bytes with every timestamp blanked (key order and encoding kept)."""
    return re.sub(rb'"(ts|startedAt)":"[^"]*"', rb'"\1":""', data)


# -- names ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", BAD_NAMES)
async def test_invalid_session_id_refused_and_nothing_created(
    store: SessionStore, tmp_path: Path, bad: Any
) -> None:
    """Unsafe or non-string session ids raise InvalidNameError everywhere; no file appears."""
    with pytest.raises(InvalidNameError):
        await store.create(tenant="default", channel="console", conversation="c", session_id=bad)
    with pytest.raises(InvalidNameError):
        await store.open("default", bad)
    with pytest.raises(InvalidNameError):
        await store.exists("default", bad)
    with pytest.raises(InvalidNameError):
        await store.read_log("default", bad)
    with pytest.raises(InvalidNameError):
        await store.message_page("default", bad)
    assert names_under(tmp_path) == []


@pytest.mark.parametrize("bad", BAD_NAMES)
async def test_invalid_tenant_refused_and_nothing_created(
    store: SessionStore, tmp_path: Path, bad: Any
) -> None:
    """Unsafe or non-string tenants raise InvalidNameError before anything is stored."""
    with pytest.raises(InvalidNameError):
        await store.create(tenant=bad, channel="console", conversation="c", session_id="s1")
    with pytest.raises(InvalidNameError):
        await store.open(bad, "s1")
    with pytest.raises(InvalidNameError):
        await store.list_sessions(bad)
    with pytest.raises(InvalidNameError):
        await store.read_log(bad, "s1")
    assert names_under(tmp_path) == []
    assert await store.list_sessions() == []


# -- create / open / exists ----------------------------------------------------------------------


async def test_create_with_taken_id_raises_session_exists(store: SessionStore) -> None:
    """create() refuses an id that already has a log and leaves that log as it was."""
    writer = await store.create(tenant="default", channel="console", conversation="c",
                                session_id="s1")
    await writer.aclose()
    before = await store.read_log("default", "s1")
    with pytest.raises(SessionExistsError):
        await store.create(tenant="default", channel="console", conversation="other",
                           session_id="s1")
    assert await store.read_log("default", "s1") == before


async def test_a_generated_id_that_is_taken_is_retried(store: SessionStore) -> None:
    """A generated id that is already taken is retried with a fresh one (the session is
    created, not a SessionExistsError); only MAX_ID_TRIES taken ids in a row give up."""
    assert isinstance(store, JsonlSessionStore | PostgresSessionStore)
    writer = await store.create(tenant="default", channel="console", conversation="a",
                                session_id="20260101-000000-aa")
    await writer.aclose()
    drawn = iter(["20260101-000000-aa", "20260101-000000-aa", "20260101-000000-bb"])
    store.new_id = lambda: next(drawn)
    writer = await store.create(tenant="default", channel="console", conversation="b")
    await writer.aclose()
    assert writer.session_id == "20260101-000000-bb"
    store.new_id = lambda: "20260101-000000-aa"
    with pytest.raises(SessionExistsError):
        await store.create(tenant="default", channel="console", conversation="c")
    assert sorted(i.session_id for i in await store.list_sessions("default")) \
        == ["20260101-000000-aa", "20260101-000000-bb"]


async def test_missing_session_is_not_found(store: SessionStore) -> None:
    """open(), read_log() and message_page() of an unknown id raise SessionNotFoundError."""
    assert await store.exists("default", "nope") is False
    with pytest.raises(SessionNotFoundError):
        await store.open("default", "nope")
    with pytest.raises(SessionNotFoundError):
        await store.read_log("default", "nope")
    with pytest.raises(SessionNotFoundError):
        await store.message_page("default", "nope")
    writer = await store.create(tenant="default", channel="console", conversation="c",
                                session_id="s1")
    await writer.aclose()
    assert await store.exists("default", "s1") is True
    assert await store.exists("acme", "s1") is False


async def test_resume_continues_seq_and_writes_nothing_twice(store: SessionStore) -> None:
    """open() recovers the writer state: seq goes on, known sections and tools are not rewritten."""
    await conversation(store)
    writer = await store.open("default", "s1")
    state = writer.state
    assert (state.message_count, state.call_count, state.last_prompt) == (
        4, 2, PROMPT_B.fingerprint,
    )
    await add(writer, user("and now?"))
    report = await persist_call(
        writer, call_request(PROMPT_A, ((0, 5),), reason="rebuilt", tools=TOOLS_B))
    await writer.aclose()
    assert (report.call, report.sections_written, report.tools_written) == (2, 0, False)
    data = await store.read_log("default", "s1")
    seqs = [orjson.loads(line)["seq"] for line in data.splitlines()]
    assert seqs == list(range(len(seqs)))
    replay = replay_bytes(data)
    assert (replay.problems, len(replay.calls), len(replay.prompts)) == ((), 3, 3)


async def test_create_header_carries_extra_keys(store: SessionStore) -> None:
    """The header names id, channel, conversation, tenant and generation, plus extra keys it
    lacks."""
    writer = await store.create(tenant="acme", channel="slack", conversation="T1:C1",
                                session_id="s1", extra={"model": "m", "channel": "ignored",
                                                        "generation": 7})
    await writer.aclose()
    head = orjson.loads((await store.read_log("acme", "s1")).splitlines()[0])
    assert {k: v for k, v in head.items() if k not in ("ts", "startedAt")} == {
        "type": "session", "seq": 0, "version": entries.FORMAT_VERSION, "id": "s1",
        "channel": "slack", "conversation": "T1:C1", "tenant": "acme", "generation": 1,
        "model": "m",
    }


# -- read side -----------------------------------------------------------------------------------


async def test_message_page_holds_only_messages(store: SessionStore) -> None:
    """message_page skips prompt, section, tools, call and outcome entries, and pages."""
    await conversation(store)
    page = await store.message_page("default", "s1")
    assert (page.session_id, page.total, page.offset) == ("s1", 4, 0)
    assert [m["message"] for m in page.messages] == [
        user("what time is it?"),
        tool_use("t1", "get_time", {"tz": "UTC"}),
        tool_result("t1", "12:00"),
        assistant("noon"),
    ]
    assert [sorted(m) for m in page.messages] == [["message", "seq", "ts"]] * 4
    second = await store.message_page("default", "s1", offset=1, limit=2)
    assert (second.total, [m["seq"] for m in second.messages]) == (4, [8, 9])
    with pytest.raises(ValueError, match=">= 0"):
        await store.message_page("default", "s1", offset=-1)


async def test_message_page_keeps_a_messages_meta(store: SessionStore) -> None:
    """A message entry's meta (a scheduled turn's trigger notes its schedule there) is on its
    page item; a message without one has none."""
    writer = await store.create(tenant="default", channel="console", conversation="c",
                                session_id="s1")
    noted = {"scheduled": {"schedule": "s1a2b3c4", "occurrence": "2026-03-03T08:00:00.000Z",
                           "created_by": "operator"}}
    await writer.append([entries.message(user("scheduled: s1a2b3c4 say hi"), noted),
                         entries.message(assistant("hi"))])
    await writer.sync()
    await writer.aclose()
    page = await store.message_page("default", "s1")
    assert [m.get("meta") for m in page.messages] == [noted, None]
    assert [sorted(m) for m in page.messages] == [["message", "meta", "seq", "ts"],
                                                  ["message", "seq", "ts"]]


async def test_list_sessions_newest_first_per_tenant(store: SessionStore) -> None:
    """Listings are newest first, per tenant or all, with counts, first text and sizes."""
    first = await store.create(tenant="default", channel="console", conversation="c",
                               session_id="older")
    await add(first, assistant("hello there"), user("first question"), user("second"))
    await first.aclose()
    await next_millisecond()  # startedAt has millisecond precision
    second = await store.create(tenant="default", channel="web", conversation="c",
                                session_id="newer")
    await second.aclose()
    await next_millisecond()
    other = await store.create(tenant="acme", channel="slack", conversation="c", session_id="x1")
    await other.aclose()

    default = await store.list_sessions("default")
    rows = [(i.session_id, i.channel, i.conversation, i.version, i.message_count,
             i.first_user_text, i.torn) for i in default]
    assert rows == [
        ("newer", "web", "c", 3, 0, None, False),
        ("older", "console", "c", 3, 3, "first question", False),
    ]
    sizes = [len(await store.read_log("default", i.session_id)) for i in default]
    assert [i.size_bytes for i in default] == sizes
    assert [(i.tenant, i.session_id) for i in await store.list_sessions()] == [
        ("acme", "x1"), ("default", "newer"), ("default", "older"),
    ]
    assert [i.session_id for i in await store.list_sessions("acme")] == ["x1"]
    assert await store.list_sessions("nobody") == []


async def test_latest_session_is_the_newest_of_its_conversation(store: SessionStore) -> None:
    """latest_session() names the newest session whose header has that conversation."""
    assert await store.latest_session("default", "c") is None
    for sid, conv in (("a1", "c"), ("a2", "other"), ("a3", "c")):
        writer = await store.create(tenant="default", channel="web", conversation=conv,
                                    session_id=sid)
        await writer.aclose()  # (no pause needed: the order is creation order)
    assert [await store.latest_session("default", c) for c in ("c", "other", "none")] == [
        "a3", "a2", None,
    ]
    assert await store.latest_session("acme", "c") is None


async def test_read_log_replays_every_call(store: SessionStore) -> None:
    """read_log() returns JSONL bytes that replay without problems, call for call."""
    await conversation(store)
    replay = replay_bytes(await store.read_log("default", "s1"))
    assert (replay.problems, replay.torn_tail, replay.version) == ((), False, 3)
    assert [(t.entry_number, t.prompt.number if t.prompt else None, len(replay.sent(t)))
            for t in replay.calls] == [(0, 1, 1), (1, 2, 3)]
    assert replay.request(replay.calls[1])["system"] == PROMPT_B.text


@pytest.mark.services
async def test_backends_write_the_same_lines(
    jsonl_store: JsonlSessionStore, pg_store: PostgresSessionStore
) -> None:
    """The same session written to both stores gives the same bytes, timestamps aside."""
    await conversation(jsonl_store)
    await conversation(pg_store)
    file_log = await jsonl_store.read_log("default", "s1")
    db_log = await pg_store.read_log("default", "s1")
    assert without_times(db_log) == without_times(file_log)
    file_replay, db_replay = replay_json(replay_bytes(file_log)), replay_json(replay_bytes(db_log))
    assert [t["window"] for t in db_replay["calls"]] == [t["window"] for t in file_replay["calls"]]
    assert db_replay["sections"] == file_replay["sections"]


# -- erasure -----------------------------------------------------------------------------------


def _stone(sessions: list[str]) -> dict[str, Any]:
    return tombstone(tenant="default", kind="person", channel="console", ident="u1",
                     requested_by="operator", sessions=sessions, removed={"session": 2})


async def test_erase_deletes_sessions_and_records_a_tombstone(store: SessionStore) -> None:
    """erase removes exactly the named sessions (reads, lists, latest all forget them), skips
    unknown ids, and records the tombstone as given."""
    await conversation(store, "s1")
    await conversation(store, "s2")
    keep = await store.create(tenant="default", channel="console", conversation="other",
                              session_id="s3", extra={"scope": {"kind": "chat", "id": "x"}})
    await keep.aclose()
    assert await store.latest_session("default", "c") in ("s1", "s2")
    stone = _stone(["s1", "s2", "gone"])
    assert sorted(await store.erase("default", ["s1", "s2", "gone"], stone)) == ["s1", "s2"]
    assert [i.session_id for i in await store.list_sessions("default")] == ["s3"]
    assert (await store.list_sessions("default"))[0].scope == {"kind": "chat", "id": "x"}
    assert await store.latest_session("default", "c") is None
    assert not await store.exists("default", "s1")
    with pytest.raises(SessionNotFoundError):
        await store.read_log("default", "s2")
    with pytest.raises(SessionNotFoundError):
        await store.open("default", "s1")
    assert await store.tombstones("default") == [stone]
    assert await store.tombstones() == [stone]
    assert await store.tombstones("other-tenant") == []


async def test_erase_refuses_bad_names_before_changing_anything(store: SessionStore) -> None:
    """An invalid id or tenant is refused up front: no session deleted, no tombstone."""
    await conversation(store, "s1")
    with pytest.raises(InvalidNameError):
        await store.erase("default", ["s1", "../x"], _stone(["s1"]))
    with pytest.raises(InvalidNameError):
        await store.erase("../t", ["s1"], _stone(["s1"]))
    assert await store.exists("default", "s1")
    assert await store.tombstones() == []


async def test_a_new_session_after_erasure_starts_clean(store: SessionStore) -> None:
    """The conversation of an erased session gets a new one; latest_session finds that."""
    await conversation(store, "s1")
    await store.erase("default", ["s1"], _stone(["s1"]))
    writer = await store.create(tenant="default", channel="console", conversation="c",
                                session_id="s9")
    await writer.aclose()
    assert await store.latest_session("default", "c") == "s9"


async def test_erase_rewrites_a_kept_session_with_markers(store: SessionStore) -> None:
    """A session that stays (a group's) has the named lines replaced by markers, with the
    deletions, under one tombstone: same seq, same message count, the old text gone, the
    listing's first text the marker; replay says erased for the calls that sent it, and the
    session can still be appended to."""
    await conversation(store, "s1")
    await conversation(store, "s2")
    before = await store.read_log("default", "s2")
    first = orjson.loads(before.split(b"\n")[1])  # the user's message, seq 1
    assert first["message"]["content"] == "what time is it?"
    line = marker_line(first, subject="ab" * 32, at="2026-05-02T09:14:03.120Z")
    deleted = await store.erase("default", ["s1"], _stone(["s1"]), {"s2": {first["seq"]: line}})
    assert deleted == ["s1"]
    after = await store.read_log("default", "s2")
    assert b"what time is it?" not in after
    assert after.split(b"\n")[1] == line
    assert len(after.split(b"\n")) == len(before.split(b"\n"))
    replay = replay_bytes(after)
    assert replay.problems == ()
    assert [c.status for c in replay.calls] == ["erased", "erased"]
    assert "erased on 2026-05-02T09:14:03.120Z" in str(replay.calls[0].why)
    [info] = await store.list_sessions("default")
    assert (info.session_id, info.first_user_text, info.message_count) == ("s2", "[erased]", 4)
    writer = await store.open("default", "s2")
    await add(writer, user("still here"))
    await writer.aclose()
    assert b"still here" in await store.read_log("default", "s2")
