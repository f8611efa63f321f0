"""A fault-injecting session store at our store seam: in memory, with the real writers' contract.

``FaultyStore()`` keeps each session's log as bytes, the same lines the real backends write
(``entries.encode_line``, ``SessionState.advance``), and fails on demand the way the JSONL and
PostgreSQL writers fail (``tests/reliability/test_fault_contract.py`` runs one fault suite on
all three):

* an ``OSError`` (``ENOSPC``, ``EIO``...): the append is **accepted** (seq numbers given, state
  advanced), then its write fails: it raises ``SessionWriteError(kind, accepted=True)`` and the
  entries are written, with their seq and ts, ahead of the next append that succeeds;
* ``"hang"``: accepted, then the write does not finish while the fault lasts (a hang chosen
  by ``decide`` lasts until the caller gives up: a timeout around it fires after acceptance,
  and the entries stay pending like a failed write's);
* ``Refuse(kind)``: refused before acceptance (``accepted=False``, state untouched), as a
  closed, broken or fenced-off writer refuses; ``Refuse("STALE_FENCE")`` raises
  ``StaleWriterError``;
* :meth:`FaultyStore.crash`: every open writer dies as a killed process does: whatever it had
  not written is lost, and the sessions can be opened again.

``store.fault`` applies to appends holding an entry whose type is in ``store.fault_types``
(``None``: every append); ``store.decide``, when set, chooses the fault per append instead
(a fault schedule). A flush or close fails only while ``store.fault`` is an error or a hang.
Session headers are never failed (a session whose creation fails is no session).
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from sessions import entries
from sessions.errors import (
    SessionExistsError,
    SessionLockedError,
    SessionNotFoundError,
    SessionWriteError,
    StaleWriterError,
)
from sessions.names import (
    DEFAULT_TENANT,
    new_session_id,
    utc_now_iso,
    validate_session_id,
    validate_tenant,
)
from sessions.order import generation_of, newest_first, session_key
from sessions.scan import recover_state, split_lines, summarise
from sessions.store import MessagePage, SessionInfo, SessionState, page_item


@dataclass(frozen=True)
class Refuse:
    """A fault that refuses the append before accepting it (``kind`` as the error says)."""

    kind: str = "BROKEN"


Fault = OSError | Refuse | str | None
Decide = Callable[[Sequence[Mapping[str, Any]]], Fault]


@dataclass
class _Log:
    data: bytearray = field(default_factory=bytearray)
    header: dict[str, Any] = field(default_factory=dict)
    writer: FaultyWriter | None = None


class FaultyWriter:
    """The writer of one in-memory session. See :class:`sessions.store.SessionWriter`."""

    def __init__(self, store: FaultyStore, log: _Log, session_id: str, tenant: str,
                 state: SessionState) -> None:
        self._store = store
        self._log = log
        self._session_id = session_id
        self._tenant = tenant
        self._state = state
        self._backlog = b""
        self._closed = False

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def tenant(self) -> str:
        return self._tenant

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def pending_bytes(self) -> int:
        return len(self._backlog)

    async def append(self, items: Sequence[Mapping[str, Any]], *, header: bool = False) -> int:
        if self._closed:
            raise SessionWriteError(self._session_id, "CLOSED", "writer is closed")
        scheduled = not header and self._store.decide is not None
        fault = None if header else self._store.fault_for(items)
        if isinstance(fault, Refuse):
            self._store.faults_raised += 1
            if fault.kind == "STALE_FENCE":
                raise StaleWriterError(self._session_id, 1, 2)
            raise SessionWriteError(self._session_id, fault.kind, "refused")
        ts = utc_now_iso()
        seq = self._state.next_seq
        data = b"".join(entries.encode_line(item, seq + n, ts) + b"\n"
                        for n, item in enumerate(items))
        # Accepted: from here on the entries belong to the log (written now or later).
        self._state.next_seq = seq + len(items)
        for item in items:
            self._state.advance(item)
        self._backlog += data
        if fault == "hang":
            self._store.faults_raised += 1
            await (asyncio.Event() if scheduled else self._store.cleared).wait()
            fault = None
        if isinstance(fault, OSError):
            self._store.faults_raised += 1
            kind = errno.errorcode.get(fault.errno or 0, type(fault).__name__)
            raise SessionWriteError(self._session_id, kind, accepted=True) from fault
        self._flush()
        return len(data)

    def _flush(self) -> None:
        if not self._closed:
            self._log.data += self._backlog
            self._backlog = b""

    async def flush(self) -> None:
        """Write what earlier failures kept, unless the disk still fails (then raise)."""
        if not self._backlog or self._closed:
            return
        fault = self._store.fault
        if isinstance(fault, OSError) or fault == "hang":
            kind = "timeout" if fault == "hang" else errno.errorcode.get(fault.errno or 0, "?")
            raise SessionWriteError(self._session_id, kind, accepted=True)
        self._flush()

    async def sync(self) -> None:
        """Nothing to make durable in memory."""

    async def erase(self, tenant: str, session_ids: Sequence[str],
                    tombstone: Mapping[str, Any]) -> list[str]:
        return await self.inner.erase(tenant, session_ids, tombstone)

    async def tombstones(self, tenant: str | None = None) -> list[dict[str, Any]]:
        return await self.inner.tombstones(tenant)

    async def aclose(self) -> None:
        if self._closed:
            return
        fault = self._store.fault
        if not (isinstance(fault, OSError) or fault == "hang"):  # else lost, as at a failed close
            self._flush()
        self._closed = True
        self._backlog = b""
        if self._log.writer is self:
            self._log.writer = None

    def die(self) -> None:
        """A process death: nothing pending is written, the session is free again."""
        self._backlog = b""
        self._closed = True
        if self._log.writer is self:
            self._log.writer = None


class FaultyStore:
    """In-memory sessions with faults on demand. See the module docstring."""

    def __init__(self) -> None:
        self._logs: dict[tuple[str, str], _Log] = {}
        self.fault: Fault = None
        self.fault_types: set[str] | None = None
        self.decide: Decide | None = None
        self.faults_raised = 0
        self.cleared = asyncio.Event()
        self.cleared.set()

    def set_fault(self, fault: Fault, types: set[str] | None = None) -> None:
        """Fail appends from now on (``None``: stop failing; hung appends finish)."""
        self.fault = fault
        self.fault_types = types
        if fault == "hang":
            self.cleared.clear()
        elif fault is None:
            self.cleared.set()

    def fault_for(self, items: Sequence[Mapping[str, Any]]) -> Fault:
        if self.decide is not None:
            return self.decide(items)
        if self.fault is None:
            return None
        if self.fault_types is not None and not {i.get("type") for i in items} & self.fault_types:
            return None
        return self.fault

    def crash(self) -> None:
        """Every open writer dies as in a killed process (see :meth:`FaultyWriter.die`)."""
        for log in self._logs.values():
            if log.writer is not None:
                log.writer.die()

    def _log(self, tenant: str, session_id: str) -> _Log:
        log = self._logs.get((validate_tenant(tenant), validate_session_id(session_id)))
        if log is None:
            raise SessionNotFoundError(f"no session {session_id!r} for tenant {tenant!r}")
        return log

    async def create(self, *, tenant: str = DEFAULT_TENANT, channel: str, conversation: str,
                     session_id: str | None = None,
                     extra: Mapping[str, Any] | None = None) -> FaultyWriter:
        sid = validate_session_id(session_id) if session_id is not None else new_session_id()
        key = (validate_tenant(tenant), sid)
        if key in self._logs:
            raise SessionExistsError(f"session {sid} already exists")
        generation = 1 + max((generation_of(log.header) for (t, _), log in self._logs.items()
                              if t == tenant and log.header.get("conversation") == conversation),
                             default=0)
        head = entries.header(sid, utc_now_iso(), tenant=tenant, channel=channel,
                              conversation=conversation, generation=generation, extra=extra)
        log = _Log(header=head)
        self._logs[key] = log
        writer = FaultyWriter(self, log, sid, tenant, SessionState())
        log.writer = writer
        await writer.append([head], header=True)
        return writer

    async def open(self, tenant: str, session_id: str) -> FaultyWriter:
        log = self._log(tenant, session_id)
        if log.writer is not None:
            raise SessionLockedError(f"session {session_id} is open")
        lines, _ = split_lines(bytes(log.data))
        writer = FaultyWriter(self, log, session_id, tenant, recover_state(lines))
        log.writer = writer
        return writer

    async def exists(self, tenant: str, session_id: str) -> bool:
        return (tenant, session_id) in self._logs

    async def latest_session(self, tenant: str, conversation: str) -> str | None:
        found = [key for (t, sid), log in self._logs.items()
                 if t == tenant and log.header.get("conversation") == conversation
                 and (key := session_key(log.header, sid)) is not None]
        return max(found)[2] if found else None

    async def list_sessions(self, tenant: str | None = None) -> list[SessionInfo]:
        infos = []
        for (t, sid), log in self._logs.items():
            if tenant is not None and t != tenant:
                continue
            summary = summarise(bytes(log.data))
            head = summary.header or {}
            infos.append(SessionInfo(sid, t, head.get("startedAt"), head.get("channel"),
                                     head.get("conversation"), head.get("version"),
                                     summary.message_count, summary.first_user_text,
                                     len(log.data), 0.0, summary.torn,
                                     generation=generation_of(head)))
        return newest_first(infos)

    async def read_log(self, tenant: str, session_id: str) -> bytes:
        return bytes(self._log(tenant, session_id).data)

    async def message_page(self, tenant: str, session_id: str, offset: int = 0,
                           limit: int = 50) -> MessagePage:
        lines, _ = split_lines(await self.read_log(tenant, session_id))
        found = [e for e in map(orjson.loads, lines[1:]) if e.get("type") == "message"]
        return MessagePage(session_id, len(found), offset, tuple(
            page_item(e) for e in found[offset:offset + limit]))

    async def erase(self, tenant: str, session_ids: Sequence[str],
                    tombstone: Mapping[str, Any]) -> list[str]:
        return await self.inner.erase(tenant, session_ids, tombstone)

    async def tombstones(self, tenant: str | None = None) -> list[dict[str, Any]]:
        return await self.inner.tombstones(tenant)

    async def aclose(self) -> None:
        return None
