"""The embedded default store: one JSONL file per session under a data directory.

Layout::

    <data_dir>/sessions/<id>.jsonl                      default tenant
    <data_dir>/erasures.jsonl                           its tombstones (sessions.tombstones)
    <data_dir>/tenants/<tenant>/sessions/<id>.jsonl     any other tenant
    <data_dir>/tenants/<tenant>/erasures.jsonl          its tombstones

Files are 0600, directories 0700 (existing ones are tightened on first use). Each session has
one writer, enforced across processes with ``flock``.

Writers (:mod:`sessions.jsonl_writer`) accept appends at once and leave the writing to the
store's disk lane (:mod:`sessions.disk_lane`), one thread, so a hung disk never blocks the
event loop. A failed or short write is rolled back with ``ftruncate`` to the last whole line,
so no half-written line is ever left behind by an error (only a crash can tear the last line,
and the next :meth:`JsonlSessionStore.open` repairs that). :meth:`JsonlSessionStore.read_log`
first lets an open writer of this store write what it has queued, so a session reads as its
writer has accepted it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from sessions import entries
from sessions.disk_lane import DiskLane, FileOps, OsFileOps
from sessions.encoding import loads_entry
from sessions.errors import (
    CorruptHeaderError,
    SessionExistsError,
    SessionLockedError,
    SessionNotFoundError,
    SessionReadError,
    SessionWriteError,
)
from sessions.files import (
    FILE_MODE,
    describe_entry,
    ensure_private_dir,
    read_first_line,
    read_regular,
)
from sessions.jsonl_prune import prune as prune_files
from sessions.jsonl_rewrite import read_fd, rewrite_lines
from sessions.jsonl_writer import JsonlSessionWriter, errno_kind
from sessions.names import (
    DEFAULT_TENANT,
    create_with_fresh_id,
    new_session_id,
    utc_iso,
    validate_session_id,
    validate_tenant,
)
from sessions.order import (
    SessionKey,
    generation_of,
    newest_first,
    next_generation,
    session_key,
)
from sessions.reserve import Reserve
from sessions.scan import recover_state, split_lines, summarise
from sessions.store import (
    DURABILITY_LEVELS,
    Cutoffs,
    Durability,
    MessagePage,
    Pruned,
    SessionInfo,
    SessionState,
    page_item,
)
from sessions.sync_lane import FileSyncer, SyncLane
from sessions.tombstones import ERASURES_FILE, decode_lines, encode

log = logging.getLogger(__name__)

READ_FLUSH_WAIT = 1.0
"""Seconds :meth:`JsonlSessionStore.read_log` waits for an open writer's queued entries to
reach the file before it reads what is there."""


class JsonlSessionStore:
    """JSONL files under ``data_dir``. See :class:`sessions.store.SessionStore`."""

    def __init__(self, data_dir: Path | str, durability: Durability = "turn", *,
                 folder: str | None = None,
                 new_id: Callable[[], str] = new_session_id,
                 stall_after: float = 2.0, ops: FileOps | None = None,
                 reserve: Reserve | None = None,
                 syncer: FileSyncer | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        """``folder``: keep every tenant's sessions in ``<data_dir>/<folder>/<tenant>/``
        instead of the gateway's own layout (the rerun logs of ``gateway replay --rerun``).
        ``new_id`` draws the ids of sessions created without one (tests force collisions).
        ``stall_after``: seconds after which a write the disk has not finished is reported as
        ``STALLED`` (the gateway passes its persist timeout). ``ops``: the disk operations
        (tests pass a disk that fails or hangs). ``reserve``: room a close may free when the
        disk is full, so it writes what it would otherwise drop (:mod:`sessions.reserve`).
        ``syncer``: where the sessions' fsyncs go (a sync lane shared with the owed journal,
        so turns ending together share its rounds); by default one of this store's own.
        ``clock``: the Unix time entries are stamped with (``ts``, a header's ``startedAt``);
        tests pin it to a day of their choosing."""
        if durability not in DURABILITY_LEVELS:
            raise ValueError(f"durability must be one of {', '.join(DURABILITY_LEVELS)}")
        self.data_dir = Path(data_dir)
        self.folder = folder
        self.new_id = new_id
        self.durability: Durability = durability
        # tenant -> conversation label -> key of its latest session (sessions.order); built
        # from the headers on first use, then kept up to date by this store's creations.
        self._latest: dict[str, dict[str, SessionKey]] = {}
        self._created: dict[str, dict[str, SessionKey]] = {}  # created while it was rebuilt
        # (tenant, conversation) -> the highest generation handed to a creation in progress.
        self._creating: dict[tuple[str, str], int] = {}
        self._index_locks: dict[str, asyncio.Lock] = {}
        self._reported: set[tuple[str, str]] = set()  # (tenant, file name) skipped by the index
        self._ops: FileOps = ops or OsFileOps()
        self._lane = DiskLane(f"jsonl:{self.data_dir.name}")
        self._syncer: FileSyncer = syncer or SyncLane(self._ops.fsync,
                                                      f"fsync:{self.data_dir.name}")
        self._stall_after = stall_after
        self._writers: dict[Path, JsonlSessionWriter] = {}  # open writers, by file
        self._reserve = reserve
        self._clock = clock

    # -- paths -------------------------------------------------------------------------------

    def sessions_dir(self, tenant: str) -> Path:
        validate_tenant(tenant)
        if self.folder is not None:
            return self.data_dir / self.folder / tenant
        if tenant == DEFAULT_TENANT:
            return self.data_dir / "sessions"
        return self.data_dir / "tenants" / tenant / "sessions"

    def path_of(self, tenant: str, session_id: str) -> Path:
        return self.sessions_dir(tenant) / f"{validate_session_id(session_id)}.jsonl"

    def _private_sessions_dir(self, tenant: str) -> Path:
        # Validate before any mkdir/chmod: a tenant like "../../x" must not touch the disk.
        validate_tenant(tenant)
        ensure_private_dir(self.data_dir)
        if self.folder is not None:
            ensure_private_dir(self.data_dir / self.folder)
        elif tenant != DEFAULT_TENANT:
            ensure_private_dir(self.data_dir / "tenants")
            ensure_private_dir(self.data_dir / "tenants" / tenant)
        return ensure_private_dir(self.sessions_dir(tenant))

    def erasures_path(self, tenant: str) -> Path:
        """The tenant's tombstones, beside (never inside) its sessions folder."""
        directory = self.sessions_dir(tenant)
        if self.folder is not None:
            return directory.parent / f"{tenant}.{ERASURES_FILE}"
        return directory.parent / ERASURES_FILE

    def tenants(self) -> list[str]:
        if self.folder is not None:
            root = self.data_dir / self.folder
            return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        found = [DEFAULT_TENANT] if (self.data_dir / "sessions").is_dir() else []
        root = self.data_dir / "tenants"
        if root.is_dir():
            found.extend(sorted(p.name for p in root.iterdir() if (p / "sessions").is_dir()))
        return found

    # -- writers -----------------------------------------------------------------------------

    async def create(
        self,
        *,
        tenant: str = DEFAULT_TENANT,
        channel: str,
        conversation: str,
        session_id: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> JsonlSessionWriter:
        if session_id is None:
            return await create_with_fresh_id(
                lambda sid: self._create(validate_session_id(sid), tenant, channel, conversation,
                                     extra), self.new_id)
        return await self._create(validate_session_id(session_id), tenant, channel,
                                  conversation, extra)

    async def _create(self, sid: str, tenant: str, channel: str, conversation: str,
                      extra: Mapping[str, Any] | None) -> JsonlSessionWriter:
        directory = self._private_sessions_dir(tenant)
        if self._reserve is not None and self._reserve.wanted:
            # Made again once there is room (tried at most every retry_after while full).
            await asyncio.to_thread(self._reserve.ensure)
        path = directory / f"{sid}.jsonl"
        # The new session comes after the conversation's latest and after any creation of it
        # still under way here (read and counted with no await in between, so creations that
        # overlap are numbered in the order they got here).
        latest = (await self._index(tenant)).get(conversation)
        slot = (tenant, conversation)
        generation = max(next_generation(latest), self._creating.get(slot, 0) + 1)
        self._creating[slot] = generation
        try:
            return await self._create_file(directory, path, sid, tenant, channel, conversation,
                                           generation, extra)
        finally:
            if self._creating.get(slot) == generation:
                del self._creating[slot]

    async def _create_file(self, directory: Path, path: Path, sid: str, tenant: str,
                           channel: str, conversation: str, generation: int,
                           extra: Mapping[str, Any] | None) -> JsonlSessionWriter:
        # The header is written under a temporary name and the file linked into place with it:
        # a session without its header is no session, and a crash must not leave one behind
        # (os.link refuses an existing name, as O_EXCL would).
        temporary = directory / f".{sid}.jsonl.new"
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL,
                         FILE_MODE)
        except FileExistsError as exc:
            raise SessionExistsError(f"session {sid} is being created") from exc
        except OSError as exc:
            raise SessionWriteError(sid, errno_kind(exc), "create") from exc
        writer = self._writer(path, fd, sid, tenant, SessionState(), 0)
        try:
            self._lock(fd, sid)
            head = entries.header(
                sid, utc_iso(self._clock()), tenant=tenant, channel=channel,
                conversation=conversation, generation=generation, extra=extra,
            )
            await writer.append([head])
            await writer.flush()  # the header is in the file before the file has its name
            try:
                os.link(temporary, path)
            except FileExistsError as exc:
                raise SessionExistsError(f"session {sid} already exists") from exc
            except OSError as exc:
                raise SessionWriteError(sid, errno_kind(exc), "create") from exc
            # Remember it even while the header index is being rebuilt (after an erasure: the
            # scan may have listed the directory before this file existed).
            self._note_latest(tenant, conversation, (generation, head["startedAt"], sid))
        except BaseException:
            await writer.abandon()
            raise
        finally:
            temporary.unlink(missing_ok=True)
        return writer

    async def open(self, tenant: str, session_id: str) -> JsonlSessionWriter:
        path = self.path_of(tenant, session_id)
        closing = self._writers.get(path)
        if closing is not None and closing.closing:  # our own writer, still closing the file
            await closing.aclose()
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND)
        except FileNotFoundError as exc:
            raise SessionNotFoundError(f"no session {session_id!r} for tenant {tenant!r}") from exc
        try:
            self._lock(fd, session_id)
            os.fchmod(fd, FILE_MODE)
            data = await asyncio.to_thread(read_fd, fd)
            lines, torn = split_lines(data)
            # Check the header before repairing: a log we refuse to resume is left untouched.
            _check_writable_header(lines, session_id)
            size = len(data)
            if torn:
                size = len(data) - len(data.rsplit(b"\n", 1)[-1])
                os.ftruncate(fd, size)
                log.warning("session %s: dropped a torn last line (%d bytes)", session_id,
                            len(data) - size)
            state = recover_state(lines)
        except BaseException:
            os.close(fd)
            raise
        return self._writer(path, fd, session_id, tenant, state, size)

    def _writer(self, path: Path, fd: int, session_id: str, tenant: str, state: SessionState,
                size: int) -> JsonlSessionWriter:
        writer = JsonlSessionWriter(path, fd, session_id, tenant, state, size, self.durability,
                                    lane=self._lane, ops=self._ops, syncer=self._syncer,
                                    stall_after=self._stall_after, on_close=self._closed,
                                    reserve=self._reserve, clock=self._clock)
        self._writers[path] = writer
        return writer

    def _closed(self, writer: JsonlSessionWriter) -> None:
        if self._writers.get(writer.path) is writer:
            del self._writers[writer.path]

    @staticmethod
    def _lock(fd: int, session_id: str) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise SessionLockedError(f"session {session_id} is open in another process") from exc

    # -- readers -----------------------------------------------------------------------------

    async def exists(self, tenant: str, session_id: str) -> bool:
        return self.path_of(tenant, session_id).is_file()

    async def latest_session(self, tenant: str, conversation: str) -> str | None:
        found = (await self._index(tenant)).get(conversation)
        if found is not None and not self.path_of(tenant, found[2]).is_file():
            # Erased (maybe by another process: ``gateway forget``): look again from the disk.
            self._latest.pop(tenant, None)
            return await self.latest_session(tenant, conversation)
        return found[2] if found else None

    async def _index(self, tenant: str) -> dict[str, SessionKey]:
        """conversation -> key of its latest session, built from the headers on first use."""
        index = self._latest.get(tenant)
        if index is None:
            # One scan per tenant, however many conversations ask at once.
            async with self._index_locks.setdefault(tenant, asyncio.Lock()):
                index = self._latest.get(tenant)
                if index is None:
                    index = await asyncio.to_thread(self._index_headers, tenant)
                    for conv, key in self._created.pop(tenant, {}).items():
                        if conv not in index or index[conv] < key:
                            index[conv] = key
                    self._latest[tenant] = index
        return index

    def _note_latest(self, tenant: str, conversation: str, key: SessionKey) -> None:
        index = self._latest.get(tenant)
        if index is None:
            index = self._created.setdefault(tenant, {})
        if conversation not in index or index[conversation] < key:
            index[conversation] = key

    def _index_headers(self, tenant: str) -> dict[str, SessionKey]:
        """conversation -> key of its latest session (:mod:`sessions.order`), from the headers.

        A file that is not a readable session log (not a regular file, no JSON object header,
        an absurd first line) is skipped and reported once, with the reason: one bad file
        must not keep a tenant's conversations from starting or resuming."""
        index: dict[str, SessionKey] = {}
        directory = self.sessions_dir(tenant)
        for path in _session_paths(directory):
            try:
                head = _header_of(read_first_line(path))
            except FileNotFoundError:
                continue  # deleted since the directory was listed (gateway sessions prune)
            except (OSError, SessionReadError) as exc:
                self._skipped(tenant, path, _reason(exc))
                continue
            if head is None:
                self._skipped(tenant, path, "its first line is not a session header")
                continue
            conv, key = head.get("conversation"), session_key(head, path.stem)
            if isinstance(conv, str) and key is not None and (conv not in index
                                                              or index[conv] < key):
                index[conv] = key
        return index

    def _skipped(self, tenant: str, path: Path, reason: str) -> None:
        """Report a file the index skips, once per store (the index is built once a tenant)."""
        if (tenant, path.name) in self._reported:
            return
        self._reported.add((tenant, path.name))
        log.warning("sessions: skipped %r in tenant %s: %s", path.name, tenant, reason)

    async def read_log(self, tenant: str, session_id: str) -> bytes:
        path = self.path_of(tenant, session_id)
        writer = self._writers.get(path)
        if writer is not None:  # read what the writer accepted, unless the disk is stuck
            with contextlib.suppress(SessionWriteError, TimeoutError):
                await asyncio.wait_for(writer.flush(), READ_FLUSH_WAIT)
        try:
            return await asyncio.to_thread(read_regular, path)
        except FileNotFoundError as exc:
            raise SessionNotFoundError(f"no session {session_id!r} for tenant {tenant!r}") from exc

    async def list_sessions(self, tenant: str | None = None) -> list[SessionInfo]:
        tenants = [validate_tenant(tenant)] if tenant is not None else self.tenants()
        return await asyncio.to_thread(self._list_sync, tenants)

    def _list_sync(self, tenants: list[str]) -> list[SessionInfo]:
        infos: list[SessionInfo] = []
        for name in tenants:
            for path in _session_paths(self.sessions_dir(name)):
                info = session_info(path, name)
                if info is not None:
                    infos.append(info)
        return newest_first(infos)

    async def message_page(
        self, tenant: str, session_id: str, offset: int = 0, limit: int = 50
    ) -> MessagePage:
        if offset < 0 or limit < 0:
            raise ValueError("offset and limit must be >= 0")
        data = await self.read_log(tenant, session_id)
        lines, _ = split_lines(data)
        messages: list[dict[str, Any]] = []
        for raw in lines[1:]:
            entry = loads_entry(raw)
            if entry is not None and entry.get("type") == "message":
                messages.append(page_item(entry))
        return MessagePage(
            session_id=session_id,
            total=len(messages),
            offset=offset,
            messages=tuple(messages[offset : offset + limit]),
        )

    # -- retention ---------------------------------------------------------------------------

    async def prune(self, cutoffs: Cutoffs, *, dry: bool = False) -> list[Pruned]:
        """See :meth:`sessions.store.SessionStore.prune`: :mod:`sessions.jsonl_prune`, in a
        thread (file system calls). Rerun logs (a ``folder`` store) are not in its layout."""
        if self.folder is not None:
            return []
        only = None if cutoffs.default is not None or len(cutoffs.tenants) != 1 \
            else next(iter(cutoffs.tenants))
        return await asyncio.to_thread(prune_files, self.data_dir, cutoffs, tenant=only,
                                       dry=dry)

    # -- erasure -----------------------------------------------------------------------------

    async def erase(self, tenant: str, session_ids: Sequence[str],
                    tombstone: Mapping[str, Any],
                    rewrites: Mapping[str, Mapping[int, bytes]] | None = None) -> list[str]:
        """See :meth:`sessions.store.SessionStore.erase`: every file locked first, then the
        rewrites, the deletions and the tombstone."""
        paths = [self.path_of(tenant, sid) for sid in session_ids]
        changed = {self.path_of(tenant, sid): dict(lines)
                   for sid, lines in (rewrites or {}).items()}
        line = encode(tombstone)
        deleted = await asyncio.to_thread(self._erase_sync, tenant, paths, changed, line)
        self._latest.pop(tenant, None)  # rebuilt from the headers on the next lookup
        self._created.pop(tenant, None)
        return deleted

    def _erase_sync(self, tenant: str, paths: list[Path], changed: dict[Path, dict[int, bytes]],
                    line: bytes) -> list[str]:
        held: dict[Path, int] = {}
        try:
            for path in [*paths, *changed]:
                if path in held:
                    continue
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
                except FileNotFoundError:
                    continue
                held[path] = fd
                # Every lock is taken before anything is changed: a session a running
                # gateway holds open refuses the whole erasure, so none is half done.
                self._lock(fd, path.stem)
            for path, lines in changed.items():
                if path in held and path not in paths:
                    rewrite_lines(path, held[path], lines)
            for path in paths:
                if path in held:
                    path.unlink()
        finally:
            for fd in held.values():
                os.close(fd)
        self._private_sessions_dir(tenant)
        log_path = self.erasures_path(tenant)
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)
        try:
            os.fchmod(fd, FILE_MODE)
            os.write(fd, line + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        return [path.stem for path in paths if path in held]

    async def tombstones(self, tenant: str | None = None) -> list[dict[str, Any]]:
        tenants = [validate_tenant(tenant)] if tenant is not None else self.tenants()

        def read() -> list[dict[str, Any]]:
            found: list[dict[str, Any]] = []
            for name in tenants:
                try:
                    data = self.erasures_path(name).read_bytes()
                except FileNotFoundError:
                    continue
                found.extend(decode_lines(data))
            return found

        return await asyncio.to_thread(read)

    async def aclose(self) -> None:
        return None


def _check_writable_header(lines: list[bytes], session_id: str) -> None:
    if not lines:
        raise CorruptHeaderError("session has no header; cannot resume", line=1)
    try:
        head = orjson.loads(lines[0])
    except orjson.JSONDecodeError as exc:
        raise CorruptHeaderError("header is not JSON", line=1) from exc
    if not isinstance(head, dict) or head.get("type") != "session":
        raise CorruptHeaderError("line 1 is not a session header", line=1)
    if head.get("version") != entries.FORMAT_VERSION:
        raise SessionReadError(
            f"session {session_id} is format version {head.get('version')}; only version "
            f"{entries.FORMAT_VERSION} sessions can be resumed for writing"
        )


def _session_paths(directory: Path) -> list[Path]:
    """``*.jsonl`` names in ``directory`` (none when it is missing or not a directory)."""
    try:
        with os.scandir(directory) as found:
            return [directory / e.name for e in found
                    if e.name.endswith(".jsonl") and not e.name.startswith(".")]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _header_of(first: bytes) -> dict[str, Any] | None:
    try:
        head = orjson.loads(first)
    except orjson.JSONDecodeError:
        return None
    return head if isinstance(head, dict) and head.get("type") == "session" else None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    return str(exc)


def session_info(path: Path, tenant: str) -> SessionInfo | None:
    """The listing row of the file at ``path`` (public: what a listing shows of one file,
    checked on its own by the tests); a row with ``error`` for a file that cannot be a
    session, None for one that vanished since the directory was listed."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    odd = describe_entry(st.st_mode)
    if odd is not None:
        return SessionInfo(path.stem, tenant, None, None, None, None, 0, None, st.st_size,
                           st.st_mtime, error=odd)
    try:
        summary = summarise(read_regular(path))
    except FileNotFoundError:
        return None
    except (OSError, SessionReadError) as exc:
        return SessionInfo(path.stem, tenant, None, None, None, None, 0, None, st.st_size,
                           st.st_mtime, error=_reason(exc))
    head = summary.header or {}
    return SessionInfo(
        session_id=path.stem,
        tenant=tenant,
        started_at=head.get("startedAt"),
        channel=head.get("channel"),
        conversation=head.get("conversation"),
        version=head.get("version"),
        message_count=summary.message_count,
        first_user_text=summary.first_user_text,
        size_bytes=st.st_size,
        modified=st.st_mtime,
        torn=summary.torn,
        error=None if summary.header else "no readable header",
        scope=head.get("scope") if isinstance(head.get("scope"), dict) else None,
        generation=generation_of(head),
        scheduled=summary.scheduled,
    )
