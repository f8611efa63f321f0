"""The scheduler: one task per gateway process that claims due occurrences and delivers them.

Each round: claim what is due (:meth:`~gateway.schedule.store.ScheduleStore.claim`, with the
missed-occurrence policy of :func:`gateway.schedule.triggers.plan`), deliver what is claimed
(:meth:`~gateway.schedule.store.ScheduleStore.deliver`: the router's ``deliver``, the same
owed-item path as a platform message), then wait until the store's next due time, at most
``poll`` seconds (other workers and ``gateway schedule add`` change the store too), or
until woken by a schedule set here.

With several workers every worker runs one; the store's row locks (``FOR UPDATE SKIP
LOCKED``) give each occurrence to one of them, and the owed queue's dedup step makes a
second delivery of it (after a worker was killed mid-delivery) a no-op. Leader election would
do too, but a killed leader's lock lapses only after its TTL (every schedule waits that long)
and it lives in Redis, which the outage trials flush; PostgreSQL's row locks are released
the moment the killed worker's connection drops, and every worker shares the load.

A delivery is held (``held_until``, ``held_reason``, the record's ``held`` count) and
tried again later when the tenant's proactive rate limit is reached
(``GATEWAY_SCHEDULE_PER_MINUTE``) or the router cannot take it (the store is down, the
gateway is stopping): it is deferred, never dropped, and delivered once its turn comes,
however late (the grace period applies at the claim only). The limit counts the tenant's
deliveries over the last minute in the usage ledger (shared by the workers over Redis) and is
checked before anything else, so a held delivery costs no platform call (Slack's
``conversations.open``). The occurrences held in one round wait in their order: the first
``limit`` until a place frees up, the next ``limit`` a minute after that, and so on (not all
of them again at the same instant). Each hold is counted (``gateway_schedule_held_total``)
and each round's holds are logged in one line per tenant. A target that cannot be reached (a
Telegram chat that never talked to the bot, a channel not running, a Slack person whose DM
Slack would not open) is recorded as skipped. Budgets apply as to any turn
(:mod:`gateway.usage.limits`): the person whose schedule it is pays for it (an operator's,
the tenant); the per-person message rate does not count scheduled turns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Protocol

from gateway.edge.channel import Accepted, RouterClosedError
from gateway.edge.episodes import Episode
from gateway.edge.errors import UnavailableError
from gateway.edge.ledger import UsageLedger
from gateway.edge.messages import Inbound
from gateway.edge.metrics import Metrics
from gateway.schedule import fire, triggers
from gateway.schedule.clock import Clock
from gateway.schedule.service import ScheduleSettings
from gateway.schedule.store import ScheduleStore
from gateway.usage.limits import iso_time
from sessions.errors import SessionError
from sessions.schedules import Outcome, ScheduleRecord

log = logging.getLogger(__name__)

HOLD = 5.0
"""Seconds before a delivery the router could not take is tried again."""
RETRY = 5.0
"""Seconds before a round that failed (the store is down) is tried again."""
RATE_WINDOW = 60.0


class Deliverer(Protocol):
    """The router's entry point as the scheduler sees it (``Router.deliver``)."""

    async def __call__(self, inbound: Inbound) -> Accepted: ...


class Scheduler:
    """See the module docstring. An async context manager: entering starts the task (which
    first waits for ``ready``: the channels run), leaving stops it."""

    def __init__(self, store: ScheduleStore, settings: ScheduleSettings, clock: Clock, *,
                 deliver: Deliverer, reach: fire.Reach, ledger: UsageLedger | None = None,
                 ready: asyncio.Event | None = None,
                 heartbeats: Callable[[], Awaitable[None]] | None = None,
                 woken: asyncio.Event | None = None,
                 metrics: Metrics | None = None) -> None:
        """``ready``: set once the channels run (nothing is delivered before);
        ``heartbeats``: puts the configured heartbeats in the store, once, before the first
        round (:func:`gateway.schedule.heartbeat.ensure`); ``woken``: the event that makes it
        look at the store at once (:meth:`wake` sets it; the composition root shares it with
        :class:`~gateway.schedule.service.Schedules`, built before the scheduler)."""
        self.store = store
        self.settings = settings
        self.clock = clock
        self.deliver = deliver
        self.reach = reach
        self.ledger = ledger
        self.ready = ready
        self.heartbeats = heartbeats
        self._wake = woken if woken is not None else asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._down = Episode(log, "firing schedules (schedule store)")
        self.metrics = metrics
        self.fired = 0
        self.skipped = 0
        self.held = 0
        self._waiting: dict[str, list[float]] = {}
        """Per tenant, the ``held_until`` of deliveries this process held by the rate limit
        that have not come round yet: a new one waits behind them."""
        self._held_now: dict[str, list[float]] = {}
        """This round's holds by the rate limit, per tenant (logged once per round)."""

    def wake(self) -> None:
        """Look at the store now (a schedule was set that may be due sooner)."""
        self._wake.set()

    async def __aenter__(self) -> Scheduler:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="scheduler")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def run(self) -> None:
        """Rounds until cancelled."""
        if self.ready is not None:
            await self.ready.wait()
        beats = self.heartbeats
        while True:
            self._wake.clear()
            now = self.clock.now()
            try:
                if beats is not None:
                    await beats()
                    beats = None
                busy = await self.round(now)
                due = await self.store.next_due()
                self._down.ok()
            except (OSError, SessionError) as exc:
                self._down.failed(type(exc).__name__)
                busy, due = False, now + RETRY
            except Exception:  # a bug: logged, and the next round tries again
                log.exception("a scheduler round failed")
                busy, due = False, now + RETRY
            if busy:
                continue  # a full batch: more may be due at once
            deadline = now + self.settings.poll if due is None else min(
                max(due, now), now + self.settings.poll)
            await self.clock.wait_until(deadline, self._wake)

    async def round(self, now: float) -> bool:
        """Claim, then deliver; True when a batch was full (go again at once)."""
        batch = self.settings.batch
        claimed = await self.store.claim(now, self._plan, batch)
        self._held_now = {}
        self._waiting = {tenant: kept for tenant, until in self._waiting.items()
                         if (kept := [t for t in until if t > now])}
        try:
            delivered = await self.store.deliver(now, self._deliver, batch)
        finally:
            for tenant, until in sorted(self._held_now.items()):
                log.info("tenant %s: %d scheduled deliveries held by the proactive rate limit "
                         "(%d per minute), the first until %s", tenant, len(until),
                         self.settings.proactive_per_minute, iso_time(min(until)))
        return claimed >= batch or delivered >= batch

    def _plan(self, record: ScheduleRecord, now: float) -> ScheduleRecord:
        claimed = triggers.plan(record, now, self.settings.grace)
        if claimed.skipped > record.skipped:
            skipped = claimed.skipped - record.skipped
            self._count_skipped(skipped)
            assert record.next_at is not None  # a due record: the first one skipped
            log.warning("schedule %s (tenant %s): skipped %s from %s (%s)",
                        record.id, record.tenant,
                        "1 occurrence" if skipped == 1 else f"{skipped} occurrences",
                        iso_time(record.next_at), claimed.history[-1].reason)
        return claimed

    async def _deliver(self, record: ScheduleRecord) -> ScheduleRecord:
        """Deliver ``record.firing``: the record with it cleared and the outcome kept, or held
        for a later try."""
        assert record.firing is not None
        now = self.clock.now()
        limit = self.settings.proactive_per_minute
        if limit and self.ledger is not None:
            wait = await self.ledger.hit(f"proactive:{record.tenant}", now, limit, RATE_WINDOW)
            if wait > 0:
                # Those held before it go first: a window later for every `limit` of them.
                waiting = [t for t in self._waiting.get(record.tenant, ()) if t > now]
                until = now + wait + len(waiting) // limit * RATE_WINDOW
                self._waiting[record.tenant] = [*waiting, until]
                self._held_now.setdefault(record.tenant, []).append(until)
                return self._hold(record, until, "rate_limit",
                                  f"the tenant's proactive rate limit ({limit} per minute)")
        key = await self.reach.key_of(record)
        if isinstance(key, str):
            log.warning("schedule %s (tenant %s): skipped, cannot write there: %s",
                        record.id, record.tenant, key)
            self._count_skipped(1)
            return _settle(record, Outcome(record.firing, "skipped", now, key))
        try:
            await self.deliver(fire.inbound_for(record, key, record.firing, now))
        except (UnavailableError, RouterClosedError) as exc:
            log.info("schedule %s: delivery held (%s)", record.id, type(exc).__name__)
            return self._hold(record, now + HOLD, "unavailable",
                              f"the gateway could not take it ({type(exc).__name__})")
        self.fired += 1
        if self.metrics is not None:
            self.metrics.schedule_occurrences.labels(outcome="fired").inc()
        log.info("schedule %s (tenant %s): fired the occurrence of %s in %s", record.id,
                 record.tenant, iso_time(record.firing), key.label())
        return _settle(record, Outcome(record.firing, "fired", now))

    def _hold(self, record: ScheduleRecord, until: float, reason: str,
              words: str) -> ScheduleRecord:
        self.held += 1
        if self.metrics is not None:
            self.metrics.schedule_held.labels(reason=reason).inc()
        return dataclasses.replace(record, held_until=until, held=record.held + 1,
                                   held_reason=words)

    def _count_skipped(self, count: int) -> None:
        self.skipped += count
        if self.metrics is not None:
            self.metrics.schedule_occurrences.labels(outcome="skipped").inc(count)


def _settle(record: ScheduleRecord, outcome: Outcome) -> ScheduleRecord:
    done = dataclasses.replace(record, firing=None, held_until=None, held_reason=None)
    return done.with_outcome(outcome).settled()
