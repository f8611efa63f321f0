"""The JSONL store: layout, permissions, names, locking, repair, failures and durability.

The backend-neutral store contract runs on every backend in ``test_store_contract.py``.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import shutil
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from sessions import entries
from sessions.disk_lane import DiskLane, OsFileOps
from sessions.errors import (
    CorruptHeaderError,
    InvalidNameError,
    SessionLockedError,
    SessionReadError,
    SessionWriteError,
)
from sessions.jsonl import JsonlSessionStore, JsonlSessionWriter
from sessions.persist import persist_call, record_outcome
from sessions.records import Outcome
from sessions.replay import replay_bytes
from sessions.store import Durability, SessionState
from sessions.sync_lane import SyncLane
from tests.fakes.disk import FaultyDisk
from tests.sessions.helpers import (
    PROMPT_A,
    SEED_DIR,
    SOUL,
    add,
    assistant,
    call_request,
    log_entries,
    user,
)
from tests.waiting import next_millisecond

ROOT = Path(__file__).resolve().parents[2]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def names_under(path: Path) -> list[str]:
    """Every path below ``path``, relative, sorted (what a test left on disk)."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


async def run_python(code: str, *args: str, stdin: bytes = b"") -> bytes:
    """Run ``python -c code`` from the project root; return stdout, failing on a non-zero exit."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, *args, cwd=ROOT,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin), timeout=60)
    assert proc.returncode == 0, err.decode()
    return out


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def store(data_dir: Path) -> JsonlSessionStore:
    return JsonlSessionStore(data_dir, durability="none")


# -- layout and permissions ---------------------------------------------------------------------


async def test_default_tenant_file_is_0600_in_0700_dirs(
    store: JsonlSessionStore, data_dir: Path
) -> None:
    """The default tenant's log is data/sessions/<id>.jsonl, 0600, in 0700 directories."""
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    await writer.aclose()
    assert writer.path == data_dir / "sessions" / "s1.jsonl"
    assert [mode(p) for p in (data_dir, data_dir / "sessions", writer.path)] == [
        0o700, 0o700, 0o600,
    ]


async def test_other_tenant_file_is_0600_in_0700_dirs(
    store: JsonlSessionStore, data_dir: Path
) -> None:
    """Another tenant's log is data/tenants/<t>/sessions/<id>.jsonl; every directory is 0700."""
    writer = await store.create(tenant="acme", channel="slack", conversation="c", session_id="s1")
    await writer.aclose()
    tenant_dir = data_dir / "tenants" / "acme"
    assert writer.path == tenant_dir / "sessions" / "s1.jsonl"
    dirs = [data_dir, data_dir / "tenants", tenant_dir, tenant_dir / "sessions"]
    assert [mode(p) for p in [*dirs, writer.path]] == [0o700] * 4 + [0o600]


async def test_existing_loose_directories_are_tightened(
    store: JsonlSessionStore, data_dir: Path
) -> None:
    """Directories that already exist as 0755 are made 0700 when a session is created there."""
    loose = [data_dir, data_dir / "sessions", data_dir / "tenants", data_dir / "tenants" / "acme"]
    for path in loose:
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o755)
    default = await store.create(channel="console", conversation="c", session_id="s1")
    other = await store.create(tenant="acme", channel="console", conversation="c", session_id="s1")
    await default.aclose()
    await other.aclose()
    assert [mode(p) for p in loose] == [0o700] * 4


async def test_open_tightens_a_loose_file(store: JsonlSessionStore) -> None:
    """Resuming a session whose file was made 0644 puts it back to 0600."""
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    await writer.aclose()
    writer.path.chmod(0o644)
    resumed = await store.open("default", "s1")
    await resumed.aclose()
    assert mode(writer.path) == 0o600


# -- names ---------------------------------------------------------------------------------------
# Name validation on every backend: test_store_contract.py.


async def test_traversing_tenant_never_touches_outside_directories(tmp_path: Path) -> None:
    """A tenant like '../../victim' neither creates nor chmods directories outside the store."""
    victim = tmp_path / "victim"
    victim.mkdir()
    victim.chmod(0o755)
    store = JsonlSessionStore(tmp_path / "data")
    with pytest.raises(InvalidNameError):
        await store.create(tenant="../../victim", channel="c", conversation="c")
    assert (names_under(tmp_path), mode(victim)) == (["victim"], 0o755)


# -- create / open / exists ----------------------------------------------------------------------
# create()/open()/exists() on every backend: test_store_contract.py. JSONL specifics here.


async def test_second_open_in_same_process_is_locked(store: JsonlSessionStore) -> None:
    """flock is per open file description: a second open() of a live session is refused."""
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    fds = open_fds()
    with pytest.raises(SessionLockedError):
        await store.open("default", "s1")
    assert open_fds() == fds  # the refused open closed its descriptor
    await writer.aclose()

    resumed = await store.open("default", "s1")
    with pytest.raises(SessionLockedError):
        await store.open("default", "s1")
    await resumed.aclose()
    again = await store.open("default", "s1")
    await again.aclose()


async def test_session_open_in_another_process_is_locked(
    store: JsonlSessionStore, data_dir: Path
) -> None:
    """While another process holds the writer, open() here raises SessionLockedError."""
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    await writer.aclose()
    holder = textwrap.dedent(f"""
        import asyncio, sys
        from sessions.jsonl import JsonlSessionStore
        async def main():
            writer = await JsonlSessionStore({str(data_dir)!r}).open("default", "s1")
            print("held", flush=True)
            sys.stdin.read()
            await writer.aclose()
        asyncio.run(main())
    """)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", holder, cwd=ROOT,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        assert await asyncio.wait_for(proc.stdout.readline(), timeout=60) == b"held\n"
        with pytest.raises(SessionLockedError):
            await store.open("default", "s1")
    finally:
        await asyncio.wait_for(proc.communicate(b""), timeout=60)
    assert proc.returncode == 0
    resumed = await store.open("default", "s1")
    await resumed.aclose()


async def test_torn_tail_repaired_on_open_keeping_earlier_entries(
    store: JsonlSessionStore,
) -> None:
    """open() cuts an unfinished last line; every whole line stays and seq continues."""
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    await add(writer, user("hello"))
    await persist_call(writer, call_request(PROMPT_A, ((0, 1),)))
    await add(writer, assistant("hi"))
    await writer.aclose()
    whole = writer.path.read_bytes()
    with writer.path.open("ab") as fh:
        fh.write(b'{"type":"message","seq":8,"ts":"2026-08-')

    resumed = await store.open("default", "s1")
    assert writer.path.read_bytes() == whole
    next_seq = resumed.state.next_seq
    await add(resumed, user("more"))
    await resumed.aclose()

    lines = log_entries(writer.path)
    assert [e["seq"] for e in lines] == list(range(next_seq + 1))
    replay = replay_bytes(writer.path.read_bytes())
    assert (replay.problems, replay.torn_tail) == ((), False)
    assert list(replay.messages) == [user("hello"), assistant("hi"), user("more")]


async def test_open_refuses_old_format_without_modifying_it(
    store: JsonlSessionStore, data_dir: Path
) -> None:
    """A v2 log (even with a torn tail) cannot be resumed, and open() leaves its bytes alone."""
    target = data_dir / "sessions" / "old.jsonl"
    target.parent.mkdir(parents=True)
    shutil.copyfile(SEED_DIR / "v2-late-prompt-torn-tail.jsonl", target)
    before = target.read_bytes()
    with pytest.raises(SessionReadError, match="version 2"):
        await store.open("default", "old")
    assert target.read_bytes() == before


@pytest.mark.parametrize(
    "content", [b"", b'{"type":"session","vers', b"garbage\n", b'{"type":"message"}\n']
)
async def test_open_refuses_a_log_without_header_untouched(
    store: JsonlSessionStore, data_dir: Path, content: bytes
) -> None:
    """Empty, torn-header or non-header logs raise CorruptHeaderError and are not truncated."""
    target = data_dir / "sessions" / "bad.jsonl"
    target.parent.mkdir(parents=True)
    target.write_bytes(content)
    with pytest.raises(CorruptHeaderError):
        await store.open("default", "bad")
    assert target.read_bytes() == content


# -- failed appends ------------------------------------------------------------------------------


def raw_writer(path: Path, fd: int, durability: Durability = "none") -> JsonlSessionWriter:
    """A writer over any descriptor (a device, a pipe), with its own disk and sync lanes."""
    return JsonlSessionWriter(path, fd, path.name, "default", SessionState(), 0, durability,
                              lane=DiskLane(), ops=OsFileOps(), syncer=SyncLane())


async def test_failed_append_raises_enospc_without_contents() -> None:
    """A write to a full device fails with SessionWriteError(kind=ENOSPC) naming no contents,
    on the flush and on every append while it lasts; the entries stay accepted."""
    writer = raw_writer(Path("/dev/full"), os.open("/dev/full", os.O_WRONLY))
    try:
        await persist_call(writer, call_request(PROMPT_A, ()))  # accepted, queued
        with pytest.raises(SessionWriteError) as info:
            await writer.flush()
        with pytest.raises(SessionWriteError) as again:
            await add(writer, user("more"))
        # Accepted, not written: the entries wait to be written ahead of the next append.
        assert (writer.state.call_count, writer.pending_bytes > 0) == (1, True)
    finally:
        await writer.aclose()
    assert (info.value.kind, info.value.session_id, info.value.accepted) == (
        "ENOSPC", "full", True)
    assert (again.value.kind, again.value.accepted) == ("ENOSPC", True)
    assert PROMPT_A.text not in str(info.value)
    assert SOUL not in str(info.value)


async def test_a_create_the_disk_refuses_leaves_nothing_and_reports_nothing_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A session whose header cannot be written is no session: the create raises, no file is
    left behind, and its header is not reported as "unwritten bytes lost" (nothing was)."""
    disk = FaultyDisk()
    store = JsonlSessionStore(tmp_path, durability="none", ops=disk)
    disk.fail(OSError(errno.ENOSPC, "No space left on device"))
    with caplog.at_level(logging.WARNING), pytest.raises(SessionWriteError) as info:
        await store.create(channel="console", conversation="c", session_id="s1")
    disk.recover()
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    await writer.aclose()
    assert info.value.kind == "ENOSPC"
    assert [r.getMessage() for r in caplog.records if "lost" in r.getMessage()] == []
    assert sorted(p.name for p in writer.path.parent.iterdir()) == ["s1.jsonl"]


FSIZE_SCRIPT = """
import asyncio, json, resource, signal, sys
from sessions import entries
from sessions.errors import SessionWriteError
from sessions.jsonl import JsonlSessionStore

async def main(data_dir):
    writer = await JsonlSessionStore(data_dir, durability="none").open("default", "s1")
    size = writer.path.stat().st_size
    # Past the limit the kernel writes what fits and fails the rest: a real short write.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 300, hard))
    out = {"size_before": size}
    await writer.append([entries.message({"role": "user", "content": "x" * 4000})])
    try:
        await writer.flush()
    except SessionWriteError as exc:
        out["kind"] = exc.kind
    out["size_after"] = writer.path.stat().st_size
    out["ends_on_newline"] = writer.path.read_bytes().endswith(b"\\n")
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    try:  # the next append still reports the earlier failure (its entry is still unwritten)
        await writer.append([entries.message({"role": "user", "content": "short"})])
    except SessionWriteError as exc:
        out["next_append"] = exc.kind
    await writer.flush()
    await writer.aclose()
    print(json.dumps(out))

asyncio.run(main(sys.argv[1]))
"""


async def test_short_write_rolled_back_then_written_in_order(
    store: JsonlSessionStore, data_dir: Path
) -> None:
    """A write cut by RLIMIT_FSIZE raises and truncates back to a whole line; the accepted
    entry is written, with its seq, ahead of the next append."""
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    await add(writer, user("hello"))
    await writer.aclose()
    whole = writer.path.read_bytes()

    out = await run_python(FSIZE_SCRIPT, str(data_dir))
    assert json.loads(out) == {
        "size_before": len(whole), "kind": "EFBIG", "size_after": len(whole),
        "ends_on_newline": True, "next_append": "EFBIG",
    }
    data = writer.path.read_bytes()
    assert data.startswith(whole)
    assert [e["seq"] for e in log_entries(writer.path)] == [0, 1, 2, 3]
    replay = replay_bytes(data)
    assert replay.problems == ()
    assert list(replay.messages) == [user("hello"), user("x" * 4000), user("short")]


# -- durability ----------------------------------------------------------------------------------
# fsync on a pipe fails with EINVAL, so a pipe-backed writer shows whether fsync was attempted
# without patching anything.


def pipe_writer(durability: Durability) -> tuple[JsonlSessionWriter, int]:
    read_fd, write_fd = os.pipe()
    return raw_writer(Path("p1"), write_fd, durability), read_fd


async def test_durability_none_never_fsyncs() -> None:
    """With durability 'none' appends, sync() and aclose() never call fsync."""
    writer, read_fd = pipe_writer("none")
    try:
        await add(writer, user("a"))
        await writer.sync()
        await writer.aclose()
        assert os.read(read_fd, 4096).count(b"\n") == 1
    finally:
        os.close(read_fd)


async def test_durability_turn_fsyncs_on_sync_only() -> None:
    """With durability 'turn' appends do not fsync; sync() does (and reports its failure)."""
    writer, read_fd = pipe_writer("turn")
    try:
        await add(writer, user("a"))
        await add(writer, user("b"))
        with pytest.raises(SessionWriteError) as info:
            await writer.sync()
        assert info.value.kind == "EINVAL"
        await writer.sync()  # nothing new since: no fsync, no error
        await writer.aclose()
    finally:
        os.close(read_fd)


async def test_durability_always_fsyncs_every_append() -> None:
    """With durability 'always' each append fsyncs (here failing after the bytes were written)."""
    writer, read_fd = pipe_writer("always")
    try:
        with pytest.raises(SessionWriteError) as info:
            await add(writer, user("a"))
        assert info.value.kind == "EINVAL"
        assert os.read(read_fd, 4096).count(b"\n") == 1
        await writer.aclose()
    finally:
        os.close(read_fd)


async def test_aclose_releases_even_when_final_sync_fails(
    caplog: pytest.LogCaptureFixture
) -> None:
    """aclose() closes the descriptor although its sync failed (one warning, no contents); a
    second aclose is a no-op."""
    writer, read_fd = pipe_writer("turn")
    try:
        await add(writer, user("a"))
        with caplog.at_level(logging.WARNING, logger="sessions.jsonl_writer"):
            await writer.aclose()
        assert [r.getMessage() for r in caplog.records] == [
            "session p1: final sync failed (EINVAL)"]
        await writer.aclose()
        with pytest.raises(SessionWriteError) as info:
            await add(writer, user("b"))
        assert info.value.kind == "CLOSED"
        assert os.read(read_fd, 4096).count(b"\n") == 1
        assert os.read(read_fd, 4096) == b""  # the write end is closed
    finally:
        os.close(read_fd)


@pytest.mark.parametrize("durability", ["none", "turn", "always"])
async def test_every_durability_writes_a_whole_session(
    data_dir: Path, durability: Durability
) -> None:
    """Each durability level writes, syncs and closes a real session without error."""
    store = JsonlSessionStore(data_dir, durability=durability)
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    await add(writer, user("hello"))
    await persist_call(writer, call_request(PROMPT_A, ((0, 1),)))
    await add(writer, assistant("hi"))
    await record_outcome(writer, Outcome(call=0, stop_reason="end_turn"))
    await writer.sync()
    await writer.aclose()
    assert [e["type"] for e in log_entries(writer.path)][-3:] == ["call", "message", "outcome"]


def test_unknown_durability_is_refused(data_dir: Path) -> None:
    """The store only accepts the documented durability levels."""
    with pytest.raises(ValueError, match="durability"):
        JsonlSessionStore(data_dir, durability="sometimes")  # type: ignore[arg-type]


# -- read side -----------------------------------------------------------------------------------


async def test_list_sessions_newest_first_with_tenants_and_torn(
    store: JsonlSessionStore,
) -> None:
    """Listings are newest first, per tenant or all, and a torn session is listed as torn."""
    first = await store.create(channel="console", conversation="c", session_id="older")
    await add(first, user("first question"))
    await first.aclose()
    await next_millisecond()  # startedAt has millisecond precision
    second = await store.create(channel="web", conversation="c", session_id="newer")
    await second.aclose()
    with second.path.open("ab") as fh:
        fh.write(b'{"type":"mess')
    await next_millisecond()
    other = await store.create(tenant="acme", channel="slack", conversation="c", session_id="x1")
    await other.aclose()

    default = await store.list_sessions("default")
    rows = [(i.session_id, i.channel, i.message_count, i.first_user_text, i.torn) for i in default]
    assert rows == [
        ("newer", "web", 0, None, True),
        ("older", "console", 1, "first question", False),
    ]
    assert [(i.tenant, i.session_id) for i in await store.list_sessions()] == [
        ("acme", "x1"), ("default", "newer"), ("default", "older"),
    ]
    assert [i.session_id for i in await store.list_sessions("acme")] == ["x1"]
    assert await store.list_sessions("nobody") == []


async def test_read_log_returns_exact_bytes(store: JsonlSessionStore) -> None:
    """read_log returns the file's bytes unchanged (torn tail included) for replay to judge."""
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    await writer.append([entries.message(user("hi"))])
    await writer.aclose()
    with writer.path.open("ab") as fh:
        fh.write(b'{"ty')
    assert await store.read_log("default", "s1") == writer.path.read_bytes()


async def test_entries_are_stamped_by_the_store_clock(data_dir: Path) -> None:
    """The header's start and every entry's ts read the store's clock (tests pin a day)."""
    now = [1_781_524_800.25]  # 2026-06-15T12:00:00.250Z
    store = JsonlSessionStore(data_dir, durability="none", clock=lambda: now[0])
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    now[0] += 86_400.5
    await writer.append([entries.message(user("hi"))])
    await writer.aclose()
    lines = [json.loads(line) for line in writer.path.read_bytes().splitlines()]
    assert [(e["type"], e["ts"]) for e in lines] == [
        ("session", "2026-06-15T12:00:00.250Z"), ("message", "2026-06-16T12:00:00.750Z")]
    assert lines[0]["startedAt"] == "2026-06-15T12:00:00.250Z"
