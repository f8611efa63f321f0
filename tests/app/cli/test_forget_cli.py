"""``gateway forget`` and ``gateway memory`` on both stores (JSONL, PostgreSQL): exactly the
person's memory scope and one-to-one sessions go, a tombstone stays, ``replay --list`` agrees."""

from __future__ import annotations

import asyncio
import hashlib
import io
import stat
from collections.abc import AsyncIterator, Sequence
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from app.cli import main as cli_main
from app.compose import build_gateway
from app.compose_store import blob_store_for
from app.config import Settings
from gateway.edge.messages import Attachment
from sessions import entries
from sessions.jsonl import JsonlSessionStore
from sessions.postgres.store import PostgresSessionStore
from sessions.store import SessionStore
from sessions.tombstones import subject_hash
from tests.fakes import media
from tests.fakes.memory_channel import MemoryChannel
from tests.sessions.pg import PG_URL, fresh_schema

# An id whose letters cannot occur in hex session ids: a leak into a tombstone would show.
PERSON = "lovelace"


@dataclass
class Backend:
    """Where the sessions are, and the CLI options that name it."""

    data: Path
    store_args: list[str]
    schema: str | None = None

    def store(self) -> SessionStore:
        if self.schema is None:
            return JsonlSessionStore(self.data)
        return PostgresSessionStore(PG_URL, schema=self.schema)


@pytest.fixture(params=["jsonl", pytest.param("postgres", marks=pytest.mark.services)])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    data = tmp_path / "data"
    if request.param == "jsonl":
        yield Backend(data, [])
        return
    async with fresh_schema() as name:
        yield Backend(data, ["--store-url", PG_URL, "--schema", name], name)


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli_main(list(args))
    return code, out.getvalue(), err.getvalue()


async def acli(*args: str) -> tuple[int, str, str]:
    return await asyncio.to_thread(cli, *args)


async def listed(backend: Backend) -> list[tuple[str, str]]:
    """``gateway replay --list --json``: (conversation, first message) of every session."""
    code, out, _ = await acli("replay", "--list", "--json", "--data-dir", str(backend.data),
                              *backend.store_args)
    assert code == 0
    return [(s["conversation"], s["firstUserText"]) for s in orjson.loads(out)]


async def say_all(backend: Backend, lines: Sequence[tuple[str, str, str, str]]) -> None:
    """Run a gateway (offline provider) over ``backend`` and say ``(chat, sender, type, text)``
    lines in order, each answered before the next."""
    settings = Settings(_env_file=None, GATEWAY_DATA_DIR=str(backend.data),  # type: ignore[call-arg]
                        GATEWAY_PORT=0)
    channel = MemoryChannel()
    gateway = build_gateway(settings, store=backend.store(), channels=[channel])
    await gateway.start()
    try:
        for n, (chat, sender, chat_type, text) in enumerate(lines, start=1):
            await channel.say(chat, text, sender=sender, chat_type=chat_type)
            await channel.wait_replies(n)
    finally:
        await gateway.aclose()


SCRIPT = [
    (PERSON, PERSON, "private", "remember that I like green tea"),
    (PERSON, PERSON, "private", "/new"),
    (PERSON, PERSON, "private", "remember that my code is 4242"),
    ("babbage", "babbage", "private", "remember that I like coffee"),
    ("team", PERSON, "group", "remember that the demo is friday"),
    ("team", "babbage", "group", "hello team"),
]


async def test_forget_erases_exactly_the_person_on_both_stores(backend: Backend) -> None:
    """Their memory scope and both DM sessions go, their group message becomes a marker (the
    group keeps its log), the owed journal loses their lines; the other person keeps
    everything; replay --list no longer lists their DMs; one tombstone, no raw id."""
    await say_all(backend, SCRIPT)
    assert sorted(c for c, _ in await listed(backend)) == [  # two DM sessions (/new)
        "memory:babbage", f"memory:{PERSON}", f"memory:{PERSON}", "memory:team"]

    code, out, err = await acli("forget", "--user", f"memory:{PERSON}", "--data-dir",
                                str(backend.data), *backend.store_args)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"erased memory:{PERSON} (tenant default):"
    scope_dir = f"memory/default/memory/people/{PERSON}"
    assert lines[1:3] == [f"  memory   {scope_dir}/MEMORY.md", f"  memory   {scope_dir}/scope.json"]
    assert [line.split()[0] for line in lines[3:-1]] == [
        "session", "session", "message", "journal"]
    assert lines[-1] == "tombstone recorded (1 journal, 2 memory, 1 message, 2 session)"
    assert b"green tea" not in (backend.data / "state" / "delivery.jsonl").read_bytes()

    assert sorted(await listed(backend)) == [  # the group keeps its log, with a marker
        ("memory:babbage", "remember that I like coffee"),
        ("memory:team", "[erased]")]

    persona = backend.data / "persona" / "memory" / "default" / "memory"
    assert not (persona / "people" / PERSON).exists()
    assert (persona / "people" / "babbage" / "MEMORY.md").read_text() == "I like coffee\n"
    assert (persona / "chats" / "team" / "MEMORY.md").read_text() == "the demo is friday\n"

    code, audit, _ = await acli("forget", "--audit", "--user", f"memory:{PERSON}",
                                "--data-dir", str(backend.data), *backend.store_args)
    stones = [orjson.loads(line) for line in audit.splitlines()]
    assert code == 0
    assert len(stones) == 1
    stone = stones[0]
    assert stone["subject"] == {"kind": "person", "channel": "memory",
                                "sha256": subject_hash("default", "memory", PERSON)}
    assert (stone["requestedBy"], stone["removed"]) == (
        "operator", {"journal": 1, "memory": 2, "message": 1, "session": 2})
    assert len(stone["sessions"]) == 2
    assert PERSON not in audit
    assert "tea" not in audit
    if backend.schema is None:
        assert stat.S_IMODE((backend.data / "erasures.jsonl").stat().st_mode) == 0o600

    code, again, _ = await acli("forget", "--user", f"memory:{PERSON}", "--data-dir",
                                str(backend.data), *backend.store_args)
    assert (code, again.splitlines()[-1]) == (0, "tombstone recorded (nothing was left to remove)")


async def test_forget_dry_run_changes_nothing(backend: Backend) -> None:
    """--dry-run lists the sessions that would go and removes nothing."""
    await say_all(backend, SCRIPT[:3])
    code, out, _ = await acli("forget", "--user", f"memory:{PERSON}", "--dry-run",
                              "--data-dir", str(backend.data), *backend.store_args)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"would erase memory:{PERSON} (tenant default):"
    assert [line.split()[0] for line in lines[1:-1]] == [
        "memory", "memory", "session", "session", "journal"]
    assert lines[-1] == "nothing changed (1 journal, 2 memory, 2 session)"
    assert len(await listed(backend)) == 2


async def test_forget_hands_the_erasure_to_the_running_gateway(tmp_path: Path) -> None:
    """With the person's session open in a running gateway, the command hands the erasure to
    it (its control socket): the person is erased and answered again afterwards, in a fresh
    session that carries nothing of theirs."""
    data = tmp_path / "data"
    settings = Settings(_env_file=None, GATEWAY_DATA_DIR=str(data),  # type: ignore[call-arg]
                        GATEWAY_PORT=0)
    channel = MemoryChannel()
    gateway = build_gateway(settings, channels=[channel])
    await gateway.start()
    try:
        await channel.say(PERSON, "remember that I like green tea", sender=PERSON)
        await channel.wait_replies(1)
        code, out, err = await acli("forget", "--user", f"memory:{PERSON}",
                                    "--data-dir", str(data))
        assert (code, err) == (0, "")
        await channel.say(PERSON, "hello again", sender=PERSON)
        replies = await channel.wait_replies(2)
    finally:
        await gateway.aclose()
    assert "session" in [line.split()[0] for line in out.splitlines()[1:-1]]
    assert "green tea" not in replies[1][2]
    [info] = await JsonlSessionStore(data).list_sessions()
    log = await JsonlSessionStore(data).read_log("default", info.session_id)
    assert b"green tea" not in log
    assert b"hello again" in log
    assert len(await JsonlSessionStore(data).tombstones()) == 1


def test_memory_list_show_delete(tmp_path: Path) -> None:
    """memory list names scopes; show prints one; delete removes it; bad refs are usage errors."""
    data = tmp_path / "data"
    asyncio.run(say_all(Backend(data, []), SCRIPT))
    code, out, _ = cli("memory", "list", "--data-dir", str(data))
    assert code == 0
    rows = [line.split() for line in out.splitlines()[1:]]
    assert rows == [["default", "chat", "memory:team", "1", "19"],
                    ["default", "person", "memory:babbage", "1", "14"],
                    ["default", "person", f"memory:{PERSON}", "1", "34"]]
    code, out, _ = cli("memory", "show", "--user", f"memory:{PERSON}", "--data-dir", str(data))
    assert (code, out) == (0, "== MEMORY.md\nI like green tea\n\nmy code is 4242\n")
    code, out, err = cli("memory", "show", "--chat", "memory:nope", "--data-dir", str(data))
    assert (code, err) == (1, "gateway memory: no memory for chat memory:nope (tenant default)\n")
    code, out, _ = cli("memory", "delete", "--chat", "memory:team", "--data-dir", str(data))
    assert code == 0
    assert out.splitlines()[0] == "deleted the memory of chat memory:team (tenant default): " \
                                  "2 file(s)"
    code, out, _ = cli("memory", "list", "--data-dir", str(data))
    assert "memory:team" not in out
    code, _, err = cli("memory", "show", "--user", "no-colon", "--data-dir", str(data))
    assert (code, err) == (2, "gateway memory: 'no-colon' is not CHANNEL:ID (e.g. telegram:1001)\n")


async def legacy_session(store: SessionStore, sid: str, conversation: str,
                         senders: Sequence[str]) -> None:
    """A session as gateways before scopes wrote it: no scope in the header."""
    writer = await store.create(tenant="default", channel="slack", conversation=conversation,
                                session_id=sid)
    for sender in senders:
        await writer.append([entries.message({"role": "user", "content": "hi"},
                                             {"sender": sender})])
        await writer.append([entries.message({"role": "assistant", "content": "hello"})])
    await writer.aclose()


async def test_older_sessions_are_matched_by_name_or_by_who_spoke(backend: Backend) -> None:
    """Sessions without a scope in the header are the person's when named after them or when
    they alone spoke in them; one where someone else spoke too is kept."""
    store = backend.store()
    try:
        await legacy_session(store, "old-named", f"slack:{PERSON}", [])
        await legacy_session(store, "old-dm", "slack:D0DM", [PERSON, PERSON])
        await legacy_session(store, "old-shared", "slack:C0GEN:1.2", [PERSON, "babbage"])
        await legacy_session(store, "old-other", "slack:D0OTHER", ["babbage"])
    finally:
        await store.aclose()
    code, out, _ = await acli("forget", "--user", f"slack:{PERSON}", "--dry-run",
                              "--data-dir", str(backend.data), *backend.store_args)
    assert code == 0
    assert sorted(line.split()[1] for line in out.splitlines()[1:-1]
                  if line.split()[0] == "session") == ["old-dm", "old-named"]


async def test_forget_removes_the_persons_attachments_not_the_groups(backend: Backend) -> None:
    """The photo only they sent goes (from their DM and from their group message, now a
    marker); the one someone else also sent in the group stays (the group's log still refers
    to it); the tombstone counts the blob."""
    private, shared = media.jpeg(30, 20, seed=1), media.png(12, 12)
    settings = Settings(_env_file=None, GATEWAY_DATA_DIR=str(backend.data),  # type: ignore[call-arg]
                        GATEWAY_PORT=0)
    channel = MemoryChannel()
    store = backend.store()
    gateway = build_gateway(settings, store=store, channels=[channel])
    await gateway.start()
    try:
        await channel.say(PERSON, "my photos", sender=PERSON, attachments=(
            Attachment("me.jpg", "image/jpeg", private), Attachment("s.png", "image/png", shared)))
        await channel.say("team", "look", sender=PERSON, chat_type="group",
                          attachments=(Attachment("me.jpg", "image/jpeg", private),))
        await channel.say("team", "mine too", sender="babbage", chat_type="group",
                          attachments=(Attachment("s.png", "image/png", shared),))
        await channel.wait_replies(3)
    finally:
        await gateway.aclose()
    code, out, err = await acli("forget", "--user", f"memory:{PERSON}", "--data-dir",
                                str(backend.data), *backend.store_args)
    assert (code, err) == (0, "")
    gone = hashlib.sha256(private).hexdigest()
    assert f"  blob     {gone}" in out.splitlines()
    assert out.splitlines()[-1] == ("tombstone recorded (1 blob, 1 journal, 1 message, "
                                    "1 session)")
    store = backend.store()
    blobs = blob_store_for(store, backend.data)
    try:
        left = {b.hash for b in await blobs.list_blobs("default")}
    finally:
        await store.aclose()
    assert left == {hashlib.sha256(shared).hexdigest()}


async def test_forget_removes_the_rerun_logs_of_the_persons_sessions(backend: Backend) -> None:
    """``replay --rerun --save`` copies a session's messages into a rerun log of its own:
    erasing the person removes the rerun logs of their sessions and keeps everyone else's."""
    await say_all(backend, SCRIPT[:1] + SCRIPT[3:4])
    code, out, _ = await acli("replay", "--list", "--json", "--data-dir", str(backend.data),
                              *backend.store_args)
    assert code == 0
    ids = {s["conversation"]: s["id"] for s in orjson.loads(out)}
    for conversation in (f"memory:{PERSON}", "memory:babbage"):
        code, _, err = await acli("replay", ids[conversation], "--rerun", "1", "--save",
                                  "--data-dir", str(backend.data), *backend.store_args)
        assert (code, err) == (0, "")
    reruns = backend.data / "reruns" / "default"

    def rerun_origins() -> list[str]:
        return sorted(orjson.loads(p.read_bytes().split(b"\n", 1)[0])["rerunOf"]["session"]
                      for p in reruns.glob("*.jsonl"))

    assert rerun_origins() == sorted(ids.values())
    assert any(b"green tea" in p.read_bytes() for p in reruns.glob("*.jsonl"))

    code, out, err = await acli("forget", "--user", f"memory:{PERSON}", "--data-dir",
                                str(backend.data), *backend.store_args)
    assert (code, err) == (0, "")
    assert [line.split()[0] for line in out.splitlines()[1:-1]].count("rerun") == 1
    assert rerun_origins() == [ids["memory:babbage"]]
    assert not any(b"green tea" in p.read_bytes() for p in reruns.glob("*.jsonl"))


async def test_forget_empties_the_logs_of_the_mcp_servers_their_sessions_called(
        backend: Backend) -> None:
    """A server the person's session called may have logged what the call carried: its
    stderr log (and a rotated one) is emptied and listed; a server only others called keeps
    its log."""
    store = backend.store()
    try:
        writer = await store.create(tenant="default", channel="slack",
                                    conversation=f"slack:{PERSON}", session_id="dm")
        await writer.append([entries.message({"role": "user", "content": "hi"},
                                             {"sender": PERSON})])
        await writer.append([entries.message(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                          "content": "ok"}]},
            {"toolCalls": [{"id": "t1", "tool": "clock__now", "server": "clock",
                            "name": "now", "ms": 1.0, "outcome": "ok"}]})])
        await writer.aclose()
    finally:
        await store.aclose()
    logs = backend.data / "mcp-logs"
    logs.mkdir(parents=True)
    (logs / "clock.log").write_text(f"called by {PERSON}\n")
    (logs / "clock.log.1").write_text("older\n")
    (logs / "weather.log").write_text("someone else's\n")
    code, out, err = await acli("forget", "--user", f"slack:{PERSON}", "--data-dir",
                                str(backend.data), *backend.store_args)
    assert (code, err) == (0, "")
    assert [line for line in out.splitlines() if line.startswith("  mcp-log")] == [
        "  mcp-log  clock.log", "  mcp-log  clock.log.1"]
    assert (logs / "clock.log").read_bytes() == b""
    assert (logs / "clock.log.1").read_bytes() == b""
    assert (logs / "weather.log").read_text() == "someone else's\n"
