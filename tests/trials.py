"""How big the long trials are: CI-sized in ``make test``, full in ``make trials``.

``make test`` must stay fast on a 2-core machine, so the long trials (property tests over fault
schedules, the multi-worker kill, the crash-kill runs) draw a schedule that is big enough to
exercise every path on every run; ``make trials`` (``GATEWAY_TRIALS=full``; the older
``GATEWAY_SLOW_TESTS=1`` still works) runs the full one. The soak has its own length,
``GATEWAY_SOAK_SECONDS`` (60 in ``make test``, 600 in ``make soak``).
"""

from __future__ import annotations

import os

FULL = (os.environ.get("GATEWAY_TRIALS") == "full"
        or os.environ.get("GATEWAY_SLOW_TESTS") == "1")
"""True under ``make trials``: the full schedules."""


def sized(ci: int, full: int) -> int:
    """``full`` under ``make trials``, else ``ci``."""
    return full if FULL else ci
