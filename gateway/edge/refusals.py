"""Refused requests are counted, not logged one by one.

A flood of forged requests (a bad Slack signature, a wrong webhook secret, a wrong admin token)
must not turn into a flood of log lines: each refusal is counted in
``gateway_requests_refused_total{endpoint, reason}`` and only the first refusal of an *episode*
is logged. An episode is a run of refusals with less than :data:`EPISODE_GAP` seconds between
them; the first line of the next episode says how many the previous one had. A refusal is
logged with its reason only, never with what the client sent (a guessed token, a body).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from gateway.edge.metrics import Metrics

EPISODE_GAP: Final = 60.0


class RefusalLog:
    """The refusals of one endpoint (see the module docstring)."""

    def __init__(self, metrics: Metrics, logger: logging.Logger, endpoint: str, *,
                 gap: float = EPISODE_GAP, clock: Callable[[], float] = time.monotonic) -> None:
        self._counter = metrics.requests_refused
        self._log = logger
        self.endpoint = endpoint
        self._gap = gap
        self._clock = clock
        self._last: float | None = None
        self._in_episode = 0

    def refused(self, reason: str) -> None:
        """Count one refusal; log it if it starts an episode. ``reason`` is a short constant
        (it is a metric label)."""
        self._counter.labels(endpoint=self.endpoint, reason=reason).inc()
        now = self._clock()
        if self._last is None or now - self._last > self._gap:
            before = (f"; the previous episode refused {self._in_episode}"
                      if self._in_episode > 1 else "")
            self._log.warning(
                "%s: refused a request (%s); further refusals within %.0f s of each other are "
                "counted in gateway_requests_refused_total, not logged%s",
                self.endpoint, reason, self._gap, before)
            self._in_episode = 0
        self._in_episode += 1
        self._last = now
