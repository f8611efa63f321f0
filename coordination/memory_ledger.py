"""The usage ledger of one gateway process (see :class:`gateway.edge.ledger.UsageLedger`).

Totals live in memory per (scope, UTC day), only for today and yesterday (a budget asks about
today; a day is forgotten once two have passed). A restart would start them at zero, so the
composition root gives a ``seed``: called once per day on first use, it returns what the
session logs already recorded that day (each call's scopes, tokens and cost). Message rates are
sliding windows of timestamps per scope, bounded by the limit asked.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence

from gateway.edge.ledger import NOTHING, Seed, Spent

log = logging.getLogger(__name__)


class MemoryLedger:
    """See the module docstring."""

    def __init__(self, seed: Seed | None = None) -> None:
        self._seed = seed
        self._totals: dict[str, dict[str, Spent]] = {}  # day -> scope -> spent
        self._seeding: dict[str, asyncio.Future[None]] = {}
        self._hits: dict[str, deque[float]] = {}

    async def _day(self, day: str) -> dict[str, Spent]:
        while True:
            totals = self._totals.get(day)
            if totals is not None:
                return totals
            seeding = self._seeding.get(day)
            if seeding is None:  # the first caller seeds the day; the others wait for it
                return await self._seed_day(day)
            # Shielded: a waiter cancelled (a turn cut by a stop) must not cancel the seeding
            # every other caller waits on. Woken without totals (the seeder was cancelled),
            # it seeds the day itself.
            await asyncio.shield(seeding)

    async def _seed_day(self, day: str) -> dict[str, Spent]:
        seeding = self._seeding[day] = asyncio.get_running_loop().create_future()
        totals: dict[str, Spent] = {}
        try:
            try:
                for scopes, tokens, cost in await self._seed(day) if self._seed else ():
                    _count(totals, scopes, tokens, cost)
            except Exception as exc:  # a budget without its seed still counts from now on
                log.warning("usage ledger: could not read today's usage from the logs (%s); "
                            "counting from now", type(exc).__name__)
        except BaseException:
            # Cancelled while reading the logs: store nothing (the day's totals would start
            # at zero and a budget would let a spent person through); the next caller seeds.
            del self._seeding[day]
            raise
        else:
            self._totals[day] = totals
            for old in sorted(self._totals)[:-2]:  # today and yesterday are enough
                del self._totals[old]
            return totals
        finally:
            seeding.set_result(None)

    async def add(self, scopes: Sequence[str], day: str, tokens: int, cost_usd: float) -> None:
        _count(await self._day(day), scopes, tokens, cost_usd)

    async def spent(self, scope: str, day: str) -> Spent:
        return (await self._day(day)).get(scope, NOTHING)

    async def hit(self, scope: str, now: float, limit: int, window: float) -> float:
        times = self._hits.setdefault(scope, deque())
        while times and times[0] <= now - window:
            times.popleft()
        if len(times) >= limit:
            return times[0] + window - now
        times.append(now)
        if len(self._hits) > 100_000:  # forget idle people (their windows are empty anyway)
            for key in [k for k, v in self._hits.items() if not v or v[-1] <= now - window]:
                del self._hits[key]
        return 0.0

    async def aclose(self) -> None:
        return None


def _count(totals: dict[str, Spent], scopes: Sequence[str], tokens: int, cost: float) -> None:
    for scope in scopes:
        was = totals.get(scope, NOTHING)
        totals[scope] = Spent(was.calls + 1, was.tokens + tokens, was.cost_usd + cost)
