"""Holding a fake platform's outbound methods: the crash trials' way to kill a gateway at a
moment when no reply is half-delivered.

While :meth:`OutboundHold.close` is in effect, a call of a held method (sending or editing a
message) waits before the fake applies it; :meth:`OutboundHold.drop` then answers every waiting
call with an error without applying it (its client was killed: the platform never took the
reply), and :meth:`OutboundHold.open` lets new calls through again. A call that passed the hold
before it closed has been applied (the fakes apply a call without suspending once it runs).

A *tap* (:attr:`OutboundHold.tap`) sees every held method's call twice, with no await in
between it and the fake's state: ``before`` (raise :class:`Dropped` and the call is not
applied) and ``after`` it was applied, before its answer goes back. The crash trials kill the
gateway from there, at an exact step of a reply: the platform did not take it, or took it
and the gateway never heard.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

Tap = Callable[[str, str, Mapping[str, Any], Any], None]
"""``tap(phase, method, params, result)``: phase ``before`` (result None) or ``after``."""


class Dropped(Exception):
    """A held call the platform never took (answered with an error, not applied)."""


class OutboundHold:
    def __init__(self, methods: frozenset[str]) -> None:
        self.methods = methods
        self._open = asyncio.Event()
        self._open.set()
        self._generation = 0
        self.waiting = 0
        self.tap: Tap | None = None

    def close(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    def drop(self) -> None:
        """Fail every call waiting now (never applied), and open again."""
        self._generation += 1
        self._open.set()

    async def passage(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        """Wait while closed; raise :class:`Dropped` if the wait ended with :meth:`drop`, or
        the tap (``before``) refused the call."""
        if method not in self.methods:
            return
        if not self._open.is_set():
            generation = self._generation
            self.waiting += 1
            try:
                await self._open.wait()
            finally:
                self.waiting -= 1
            if self._generation != generation:
                raise Dropped(method)
        if self.tap is not None:
            self.tap("before", method, params or {}, None)

    def applied(self, method: str, params: Mapping[str, Any], result: Any) -> None:
        """The call was applied (its answer not sent yet): the tap's ``after``."""
        if self.tap is not None and method in self.methods:
            self.tap("after", method, params, result)
