"""The field parsers of replay: one raw JSON value of a log entry in, a typed value or ``None``
(malformed) out.

Separate from the builder because they know nothing of a pass over the log: each judges one
value on its own, with the strictness the format asks for (a JSON ``true`` is not ``1``), so they
can be read and tested apart from the state they feed.
"""

from __future__ import annotations

import math
import sys
from typing import Any, TypeGuard

from sessions.records import Injected, Window


def cost_or_none(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def is_message(msg: Any) -> TypeGuard[dict[str, Any]]:
    """What :meth:`~sessions.replay_builder.Builder.on_message` accepts (inlined there: it is
    the hot path)."""
    return (
        isinstance(msg, dict)
        and isinstance(msg.get("role"), str)
        and isinstance(msg.get("content"), (str, list))
    )


def str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def window_or_none(raw: Any, available: int) -> Window | None:
    if not isinstance(raw, list):
        return None
    out: list[tuple[int, int]] = []
    for pair in raw:
        # type() rather than isinstance(): a JSON true/false must not pass as 1/0.
        if not (type(pair) is list and len(pair) == 2):
            return None
        start, end = pair
        if not (type(start) is int and type(end) is int and 0 <= start <= end <= available):
            return None
        out.append((start, end))
    return tuple(out)


def injected_or_none(raw: Any) -> tuple[Injected, ...] | None:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        return None
    out: list[Injected] = []
    for item in raw:
        # type() rather than isinstance(): a JSON true/false must not pass as 1/0. The bound
        # keeps list.insert() from overflowing on a corrupt position.
        if not (
            isinstance(item, dict)
            and type(item.get("position")) is int
            and 0 <= item["position"] <= sys.maxsize
            and is_message(item.get("message"))
        ):
            return None
        out.append(Injected(item["position"], item["message"]))
    return tuple(out)
