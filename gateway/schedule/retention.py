"""Retention in the running gateway: once an hour, the sessions older than their tenant's
retention go (``GATEWAY_RETENTION_DAYS``, ``GATEWAY_RETENTION_TENANTS``:
:class:`sessions.retention.RetentionPolicy`), then, when any went or a day has passed, the
attachment bytes no session refers to any more.

Cheap by design: a pass reads only the sessions past a cutoff (PostgreSQL: an index on the
last modification; JSONL: one ``lstat`` a file), and the blob pass, which reads the logs that
are kept, runs at most once a day. With several workers one of them does it (the elected
leader of ``retention``); a pass that fails (the store is down) is logged once and tried at
the next. ``gateway prune`` does the same once, by hand. A session open in this worker (a
JSONL writer's ``flock``) is kept until a later pass; a PostgreSQL session another worker has
open is removed, and that worker's next append finds it gone (its conversation goes on in a
new session, as after an erasure). In the schedule wing: it runs on the scheduler's clock, so
tests move time by hand.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from types import TracebackType

from gateway.edge.coordination import LeaderElector
from gateway.edge.episodes import Episode
from gateway.edge.metrics import Metrics
from gateway.schedule.clock import Clock
from sessions.blobs import BlobStore
from sessions.errors import SessionError
from sessions.retention import RetentionPolicy, prune_blobs
from sessions.store import Pruned, SessionStore

log = logging.getLogger(__name__)

EVERY = 3600.0
"""Seconds between two passes."""
BLOBS_EVERY = 86_400.0
"""Seconds between two blob passes when no session went meanwhile."""


class Retention:
    """See the module docstring. An async context manager: entering starts the passes (none
    when the policy keeps everything), leaving stops them."""

    def __init__(self, policy: RetentionPolicy, store: SessionStore, blobs: BlobStore,
                 clock: Clock, *, blob_stores: Sequence[SessionStore] = (),
                 elector: LeaderElector | None = None, every: float = EVERY,
                 metrics: Metrics | None = None) -> None:
        """``blob_stores``: every store whose sessions may refer to blobs (the sessions'
        own, and the rerun logs'); ``elector``: the election of the one worker that runs
        the passes (``None``: this process is the only one)."""
        self.policy = policy
        self.store = store
        self.blobs = blobs
        self.clock = clock
        self.blob_stores = tuple(blob_stores) or (store,)
        self.elector = elector
        self.every = every
        self.metrics = metrics
        self._task: asyncio.Task[None] | None = None
        self._blobs_at: float | None = None
        self._down = Episode(log, "retention (session store)")
        self._idle = asyncio.Event()  # never set: passes wait on the clock alone

    @property
    def running(self) -> bool:
        """Whether passes are scheduled: a policy that keeps everything starts none (what
        the tests check without reaching into the task)."""
        return self._task is not None

    async def __aenter__(self) -> Retention:
        if self.policy.any:
            self._task = asyncio.get_running_loop().create_task(self.run(), name="retention")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def run(self) -> None:
        """Passes until cancelled (while this worker leads, with several)."""
        if self.elector is not None:
            await self.elector.lead(self._passes)
        else:
            await self._passes()

    async def _passes(self) -> None:
        while True:
            now = self.clock.now()
            try:
                await self.apply(now)
                self._down.ok()
            except (OSError, SessionError) as exc:
                self._down.failed(type(exc).__name__)
            except Exception:  # a bug: logged, and the next pass tries again
                log.exception("a retention pass failed")
            await self.clock.wait_until(now + self.every, self._idle)

    async def apply(self, now: float) -> tuple[list[Pruned], int]:
        """One pass at Unix time ``now``: the sessions removed (and kept, with why), and how
        many blobs went."""
        cutoffs = self.policy.cutoffs(now)
        pruned = await self.store.prune(cutoffs)
        removed = [p for p in pruned if p.kept is None]
        blobs = 0
        if removed or self._blobs_at is None or now - self._blobs_at >= BLOBS_EVERY:
            self._blobs_at = now
            tenants = [t for t in await self.blobs.tenants() if cutoffs(t) is not None]
            found = await prune_blobs(self.blob_stores, self.blobs, tenants, now=now)
            blobs = len(found.removed)
        if removed or blobs:
            log.info("retention: removed %d session(s) (%d bytes) and %d unreferenced "
                     "blob(s)", len(removed), sum(p.size_bytes for p in removed), blobs)
        if self.metrics is not None:
            self.metrics.retained.labels(kind="sessions").inc(len(removed))
            self.metrics.retained.labels(kind="blobs").inc(blobs)
        return pruned, blobs
