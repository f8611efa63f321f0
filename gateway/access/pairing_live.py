"""Pairing as the running gateway sees it: in memory, written behind, never blocking the loop.

Access control decides on every inbound message, so it must not touch a file or Redis on the
event loop. :class:`LivePairing` keeps the pairing document in memory (a
:class:`~gateway.edge.pairing.PairingStore` over a :class:`MemoryPairingState`) and one task moves
it
to and from the real state (the private file, or Redis when workers share one) in a worker
thread:

* **write-behind**: a change (a new pending code) is applied in memory at once and queued; the
  writer applies the queued changes to the real state in one batch (one read-modify-write,
  one fsync) and reads the result back. A person is told a new code only once it is on record,
  so the operator can approve it at once; many strangers at once share a batch.
* **refresh**: every :data:`REFRESH` seconds (and before telling a person with a pending code
  that code again) the writer reads the real state, so an approval or revocation made by
  ``gateway pairing`` (another process) or another worker reaches this gateway within a
  second. Changes still queued are applied on top of what was read, so none is lost.

A paired person's message is checked against memory only. A failing real state (disk full,
Redis down) is retried on the next round and logged once per failure episode; decisions go on
from memory meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final, Self, TypeVar

from gateway.edge.pairing import PairingState, PairingStore
from gateway.edge.tasks import stop

log = logging.getLogger(__name__)

REFRESH: Final = 1.0
"""Seconds between reads of the real state (how soon an approval made elsewhere applies)."""
RETRY: Final = 1.0

T = TypeVar("T")
Change = Callable[[dict[str, Any]], object]


class MemoryPairingState:
    """The pairing document in memory (see :class:`~gateway.edge.pairing.PairingState`).

    :meth:`read` returns the live document: callers must not change it (PairingStore copies
    what it cleans). Every :meth:`update` that changed the document is remembered in
    :attr:`queued` for the writer.
    """

    def __init__(self, document: dict[str, Any] | None = None) -> None:
        self.document: dict[str, Any] = document or {}
        self.queued: list[Change] = []

    def read(self) -> dict[str, Any]:
        return self.document

    def update(self, change: Callable[[dict[str, Any]], T]) -> T:
        # Readers keep the document they were given: the change works on a copy of it down to
        # the containers a change may alter (the entries inside them are only ever replaced).
        draft = {key: _copied(value) for key, value in self.document.items()}
        result = change(draft)
        if draft != self.document:
            self.document = draft
            self.queued.append(change)
        return result


def _copied(value: object) -> object:
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    return value


class LivePairing:
    """Pairing decisions from memory over a real :class:`PairingState` (module docstring).

    An async context manager: entering loads the document and starts the writer; leaving
    writes what is still queued and stops it.
    """

    def __init__(self, backing: PairingState, *, clock: Callable[[], float] = time.time,
                 refresh: float = REFRESH, retry: float = RETRY) -> None:
        self.backing = backing
        self.memory = MemoryPairingState()
        self.store = PairingStore(self.memory, clock=clock)
        self._refresh_every = refresh
        self._retry = retry
        self._wake = asyncio.Event()
        self._synced = 0  # rounds finished
        self._round_done: asyncio.Condition | None = None
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self._closed = False

    async def __aenter__(self) -> Self:
        self.memory.document = await asyncio.to_thread(self.backing.read)
        self._round_done = asyncio.Condition()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="pairing-writer")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the writer, then write what is still queued (once; a failure is logged)."""
        task, self._task = self._task, None
        if task is None:
            return
        await stop(task)
        if self.memory.queued and not await self._round():
            log.warning("pairing state: %d change(s) could not be written before stopping "
                        "(the codes they gave are lost)", len(self.memory.queued))
        assert self._round_done is not None
        async with self._round_done:
            self._closed = True
            self._round_done.notify_all()  # nobody waits for a round that will not come

    # -- decisions (memory) -------------------------------------------------------------------

    def is_approved(self, channel: str, user: str) -> bool:
        return self.store.is_approved(channel, user)

    async def check(self, channel: str, user: str, name: str | None) -> str | None:
        """None when the person is approved; else their pending code, created if they have
        none. A new code is returned once the writer has put it on record (or, while the real
        state fails, tried to: the code is then kept in memory and written on a later round)."""
        if self.store.pending_code(channel, user) is not None:
            await self.synced()  # approved elsewhere since the last refresh?
            if self.is_approved(channel, user):
                return None
        code = self.store.request(channel, user, name)
        if self.memory.queued:
            await self.synced()
        return code

    async def synced(self) -> None:
        """Wait for a round that started after this call: queued changes written, and the
        real state read back (or that round failed and will be retried)."""
        assert self._round_done is not None, "used inside `async with`"
        async with self._round_done:
            wanted = self._synced + 2 if self._busy else self._synced + 1
            self._wake.set()
            await self._round_done.wait_for(lambda: self._closed or self._synced >= wanted)

    # -- the writer ---------------------------------------------------------------------------

    _busy = False

    async def _run(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self._refresh_every):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            self._busy = True
            try:
                ok = await self._round()
            finally:
                self._busy = False
            assert self._round_done is not None
            async with self._round_done:
                self._synced += 1
                self._round_done.notify_all()
            if not ok:
                await asyncio.sleep(self._retry)

    async def _round(self) -> bool:
        """Write the queued changes and read the real state back; False if that failed (the
        changes stay queued for the next round)."""
        batch, self.memory.queued = self.memory.queued, []
        try:
            fresh = await asyncio.to_thread(self._write_and_read, batch)
        except Exception as exc:  # the real state is down: decide from memory, retry
            self.memory.queued[:0] = batch
            if not self._failing:
                self._failing = True
                log.warning("pairing state: cannot write or read it (%s); retrying, deciding "
                            "from memory meanwhile", type(exc).__name__)
            return False
        if self._failing:
            self._failing = False
            log.info("pairing state: writes recovered")
        for change in self.memory.queued:  # made while this round was in the thread
            change(fresh)
        self.memory.document = fresh
        return True

    def _write_and_read(self, batch: list[Change]) -> dict[str, Any]:
        if batch:
            def apply(document: dict[str, Any]) -> None:
                for change in batch:
                    change(document)

            self.backing.update(apply)
        return self.backing.read()
