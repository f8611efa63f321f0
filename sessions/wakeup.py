"""Handing results from a worker thread back to an event loop, one wake-up for many.

The disk lane and the sync lane finish jobs in their threads and must run a callback on the
waiter's loop. ``loop.call_soon_threadsafe`` per result writes to the loop's self-pipe each
time: a system call in the worker (which then needs the GIL back from the busy loop) and a read
in the loop. Under load the loop is busy exactly when many results arrive, so
:func:`post` coalesces them: the first result posted since the loop last drained arms one
wake-up; the ones posted before it runs ride along, in order. A result is never held back to
wait for others (the first one wakes the loop at once), so a job that hangs after it does not
delay it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Callable

log = logging.getLogger(__name__)


class _Mailbox:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weak: the registry below maps loops to their mailboxes weakly, and a strong
        # reference from the value would keep every loop (and its mailbox) alive for good.
        self._loop = weakref.ref(loop)
        self._lock = threading.Lock()
        self._items: list[Callable[[], None]] = []
        self._armed = False  # a drain is scheduled on the loop and has not taken the items

    def post(self, callback: Callable[[], None]) -> None:
        with self._lock:
            self._items.append(callback)
            if self._armed:
                return
            self._armed = True
        loop = self._loop()
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._drain)
                return
            except RuntimeError:  # the loop has closed
                pass
        with self._lock:  # closed or gone: its waiters are long gone
            self._items.clear()
            self._armed = False

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, []
            self._armed = False
        for callback in items:
            try:
                callback()
            except Exception:  # one waiter's bug must not strand the others
                log.exception("a callback from a worker thread failed")


_boxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Mailbox] = (
    weakref.WeakKeyDictionary())
_boxes_lock = threading.Lock()


def post(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """Run ``callback`` on ``loop`` soon (thread-safe; a closed loop drops it)."""
    with _boxes_lock:
        box = _boxes.get(loop)
        if box is None:
            box = _boxes[loop] = _Mailbox(loop)
    box.post(callback)
