"""Failure-isolated writes to a session: the prompt-persist hook and message recording.

By design (STYLE rule 8) a session write never breaks a live turn: an error or a write that
takes longer than ``timeout`` is counted in ``gateway_persist_failures_total`` and logged as
**one** warning line (session id and error kind, never content) when a failure episode starts; later
failures of the same episode are counted but not logged again, and the first success after
them logs one recovery line. The turn goes on and the user still gets the answer.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.metrics import Metrics
from sessions.errors import SessionWriteError
from sessions.persist import PersistReport, persist_call
from sessions.records import CallRequest
from sessions.store import SessionWriter

log = logging.getLogger("gateway.persist")


class SessionRecorder:
    """Wraps one session's writer with the failure-isolation contract."""

    def __init__(self, writer: SessionWriter, metrics: Metrics, timeout: float) -> None:
        self.writer = writer
        self._metrics = metrics
        self._timeout = timeout
        self._failing = False

    @property
    def session_id(self) -> str:
        return self.writer.session_id

    async def persist(self, request: CallRequest) -> PersistReport | None:
        """The prompt-persist hook body: runs to completion before the provider call starts."""
        result: PersistReport | None = await self._guard(
            persist_call(self.writer, request), inline=self._inline()
        )
        return result

    async def append(self, entries: Sequence[Mapping[str, Any]]) -> bool:
        """Append entries; False (after counting and maybe logging) when the write failed."""
        return await self._guard(self.writer.append(entries), inline=self._inline()) is not None

    def _inline(self) -> bool:
        return bool(getattr(self.writer, "completes_inline", False))

    async def sync(self) -> None:
        await self._guard(self.writer.sync(), ok_value=True)

    async def _guard(self, work: Any, ok_value: Any = None, inline: bool = False) -> Any:
        try:
            if inline:
                # The write completes without suspending; a timer could never fire, and arming
                # one costs more than the write itself.
                result = await work
            else:
                async with asyncio.timeout(self._timeout):
                    result = await work
        except TimeoutError:
            self._failed("timeout")
            return None
        except SessionWriteError as exc:
            self._failed(exc.kind)
            return None
        except OSError as exc:  # a backend that did not translate its error
            self._failed(errno.errorcode.get(exc.errno or 0, type(exc).__name__))
            return None
        except Exception as exc:  # isolation by design: any store bug must not end the turn
            self._failed(type(exc).__name__)
            return None
        if self._failing:
            self._failing = False
            log.info("session %s: writes recovered", self.writer.session_id)
        return result if result is not None else (ok_value if ok_value is not None else True)

    def _failed(self, kind: str) -> None:
        self._metrics.persist_failures.labels(kind=kind).inc()
        if not self._failing:
            self._failing = True
            log.warning("session %s: session write failed (%s); the turn goes on",
                        self.writer.session_id, kind)
