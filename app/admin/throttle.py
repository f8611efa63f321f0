"""Guessing the admin token gets slow: failed sign-ins are counted per client.

A client is its address as the server sees it (behind a reverse proxy, every client is the
proxy: then the delay applies to everyone at once, which slows an attacker all the same and
costs the operator at most :data:`MAX_DELAY` seconds). The first :data:`FREE_FAILURES` failures
cost nothing (typos); after that each attempt must wait :data:`FIRST_DELAY` seconds after the
previous failure, doubling with every further failure up to :data:`MAX_DELAY`, or it is
refused (429) without the token being looked at. A success clears the client; a client quiet
for :data:`FORGET` seconds is forgotten, and at most :data:`MAX_CLIENTS` are remembered (the
oldest go first).

With a token of at least 16 characters (enforced at start) and at most one guess a minute,
guessing is hopeless; the delay mostly keeps the log and the CPU quiet.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

FREE_FAILURES: Final = 5
FIRST_DELAY: Final = 5.0
MAX_DELAY: Final = 60.0
FORGET: Final = 3600.0
MAX_CLIENTS: Final = 10_000


class LoginThrottle:
    """Failed sign-ins per client; see the module docstring."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._failures: OrderedDict[str, tuple[int, float]] = OrderedDict()  # count, last

    def wait(self, client: str) -> float:
        """Seconds ``client`` must still wait before its next attempt counts (0: go ahead)."""
        found = self._failures.get(client)
        if found is None:
            return 0.0
        count, last = found
        now = self._clock()
        if now - last > FORGET:
            del self._failures[client]
            return 0.0
        if count < FREE_FAILURES:
            return 0.0
        delay = min(MAX_DELAY, FIRST_DELAY * 2.0 ** (count - FREE_FAILURES))
        return max(0.0, last + delay - now)

    def failed(self, client: str) -> int:
        """Count a failure; the client's failures in a row."""
        count = self._failures.pop(client, (0, 0.0))[0] + 1
        self._failures[client] = (count, self._clock())
        while len(self._failures) > MAX_CLIENTS:
            self._failures.popitem(last=False)
        return count

    def succeeded(self, client: str) -> None:
        self._failures.pop(client, None)
