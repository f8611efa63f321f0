"""Failure-isolated writes to a session: the persist step of every call, and messages.

By design (STYLE rule 8) a session write never breaks a live turn: an error or a write that
takes longer than ``timeout`` is counted in ``gateway_persist_failures_total`` and logged as
**one** warning line (session id and error kind, never content) when a failure episode starts; later
failures of the same episode are counted but not logged again, and the first success after
them logs one recovery line.

Every write says what became of it (:class:`Written`, :class:`PersistResult`): *accepted*
(the writer took the entries: written, or kept to be written ahead of the next append, as
:class:`sessions.store.SessionWriter` promises) or *refused* (closed, broken, fenced off,
unencodable: they will never reach the log). The conversation lets a message join what the
model sees only once it is accepted, and the agent loop attributes an outcome to a call only
when the call was recorded. A refusal is remembered as a *gap*: the next accepted append starts
with a ``gap`` entry naming what was refused (entry types and roles, never contents), the
error kind and its time, so replay can say which call went unrecorded and why.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.edge.errors import Failure
from gateway.edge.metrics import Metrics
from sessions import entries
from sessions.errors import SessionWriteError, StaleWriterError
from sessions.names import utc_now_iso
from sessions.persist import PersistReport, persist_call
from sessions.records import CallRequest
from sessions.store import SessionWriter

log = logging.getLogger(__name__)



@dataclass(frozen=True, slots=True)
class Written:
    """What became of one guarded append.

    ``accepted``: the writer took the entries (see the module docstring). ``failure``: the
    error kind when the write did not complete (accepted or not); ``at``: when (UTC, ISO).
    """

    accepted: bool
    failure: str | None = None
    at: str | None = None


@dataclass(frozen=True, slots=True)
class PersistResult:
    """What the persist step recorded for one call (the caller acts on it).

    ``recorded``: the call entry was accepted, as call number ``call`` of the log (so replay
    can rebuild the request, and the call's outcome may be attributed to it). Otherwise
    ``failure`` and ``at`` say why and when; ``fenced`` means another worker owns the session
    now and the call must not be made.
    """

    recorded: bool
    call: int | None = None
    failure: str | None = None
    at: str | None = None
    report: PersistReport | None = None

    @property
    def fenced(self) -> bool:
        return self.failure == Failure.FENCED


class CallRecorder(Protocol):
    """The persist step of every provider call (STYLE rule 8): a required argument of the
    code that calls the provider (:class:`gateway.agent.call.Caller`), which runs it before
    every attempt, ahead of any other before-call hook.

    Contract: :meth:`record_call` writes what the provider is about to receive (the call
    entry, and any section, prompt or tools entry the log has not seen yet) into the session
    ``session`` records, and returns before the provider is called. It is failure-isolated by
    design: a store's error or timeout is logged once and counted (by ``session``), never
    raised, and the call proceeds; the result says what became of the entry (``fenced``: the
    session belongs to another worker now, and the call must not be made).
    """

    async def record_call(self, session: SessionRecorder, request: CallRequest
                          ) -> PersistResult: ...


class SessionLog:
    """The recorder of every live call: into the conversation's own session log, through its
    failure-isolated :class:`SessionRecorder`."""

    async def record_call(self, session: SessionRecorder, request: CallRequest
                          ) -> PersistResult:
        return await session.persist(request)


SESSION_LOG = SessionLog()
"""The one :class:`CallRecorder` the gateway runs with (it holds no state)."""


class SessionRecorder:
    """Wraps one session's writer with the failure-isolation contract."""

    def __init__(self, writer: SessionWriter, metrics: Metrics, timeout: float) -> None:
        self.writer = writer
        self._metrics = metrics
        self._timeout = timeout
        self._failing = False
        self._gaps: list[dict[str, Any]] = []
        self._syncing: set[asyncio.Future[None]] = set()

    @property
    def session_id(self) -> str:
        return self.writer.session_id

    @property
    def last_prompt(self) -> str | None:
        """Fingerprint of the last prompt entry the log accepted (its one owner is the log)."""
        return self.writer.state.last_prompt

    @property
    def next_call(self) -> int:
        """The number (0-based) the log will give the next recorded call."""
        return self.writer.state.call_count

    @property
    def gaps(self) -> int:
        """Refused appends not yet noted in the log (their ``gap`` entries wait for the next
        accepted append)."""
        return len(self._gaps)

    async def persist(self, request: CallRequest) -> PersistResult:
        """Record the call entry (and what it needs) before the provider is called; what
        became of it (see :class:`CallRecorder`)."""
        lead = self._take_gaps()
        call = self.writer.state.call_count  # the number persist_call gives the entry
        written, report = await self._guard(persist_call(self.writer, request, lead))
        self._settle(written, lead, [{"type": "call"}])
        if not written.accepted:
            return PersistResult(False, None, written.failure, written.at)
        return PersistResult(True, call, written.failure, written.at,
                             report if isinstance(report, PersistReport) else None)

    async def append(self, batch: Sequence[Mapping[str, Any]]) -> Written:
        """Append entries (after any pending ``gap`` entries); see :class:`Written`."""
        lead = self._take_gaps()
        written, _ = await self._guard(self.writer.append([*lead, *batch]) if lead
                                       else self.writer.append(batch))
        self._settle(written, lead, batch)
        return written

    async def flush(self) -> Written:
        """Wait (bounded, isolated) until everything accepted is in the log; what became of
        it."""
        written, _ = await self._guard(self.writer.flush(), inline=False)
        return written

    async def sync(self) -> None:
        await self._guard(self.writer.sync(), inline=False)

    def sync_soon(self) -> asyncio.Future[None]:
        """Start :meth:`sync` now and return it; it is kept referenced until it ends, so a
        caller may stop waiting (the writer's close waits for an fsync it began)."""
        syncing = asyncio.ensure_future(self.sync())
        self._syncing.add(syncing)
        syncing.add_done_callback(self._syncing.discard)
        return syncing

    def _take_gaps(self) -> list[dict[str, Any]]:
        lead, self._gaps = self._gaps, []
        return lead

    def _settle(self, written: Written, lead: list[dict[str, Any]],
                batch: Sequence[Mapping[str, Any]]) -> None:
        if written.accepted:
            return
        # Refused: the gaps it carried wait for the next append, with one for this batch.
        self._gaps[:0] = [*lead, entries.gap(written.failure or Failure.UNKNOWN,
                                             written.at or utc_now_iso(), batch)]

    async def _guard(self, work: Coroutine[Any, Any, Any],
                     inline: bool | None = None) -> tuple[Written, Any]:
        """Run ``work`` (one writer call) isolated; ``(what became of it, its result)``.

        Acceptance follows the SessionWriter contract: a writer decides before its first
        suspension, so a timeout means the entries were accepted, and an error says so itself.
        """
        if inline is None:
            inline = bool(getattr(self.writer, "completes_inline", False))
        try:
            if inline:
                # The write completes without suspending; a timer could never fire, and arming
                # one costs more than the write itself.
                result = await work
            else:
                async with asyncio.timeout(self._timeout):
                    result = await work
        except TimeoutError:
            return self._failed(Failure.TIMEOUT, accepted=True), None
        except StaleWriterError:
            return self._failed(Failure.FENCED, accepted=False), None
        except SessionWriteError as exc:
            return self._failed(exc.kind, accepted=exc.accepted), None
        except OSError as exc:  # a backend that did not translate its error
            return self._failed(errno.errorcode.get(exc.errno or 0, type(exc).__name__),
                                accepted=False), None
        except Exception as exc:  # isolation by design: any store bug must not end the turn
            kind = Failure.ENCODE if isinstance(exc, TypeError | ValueError) else type(exc).__name__
            return self._failed(kind, accepted=False), None
        if self._failing:
            self._failing = False
            log.info("session %s: writes recovered", self.writer.session_id)
        return Written(True), result

    def _failed(self, kind: str, *, accepted: bool) -> Written:
        self._metrics.persist_failures.labels(kind=kind).inc()
        if not self._failing:
            self._failing = True
            log.warning("session %s: session write failed (%s); the turn goes on",
                        self.writer.session_id, kind)
        return Written(accepted, kind, utc_now_iso())
