"""Waiting in tests: for the event itself, bounded generously, never for a fixed time.

A test waits on a future, an event or a condition when the code offers one. State that has no
change notification (a metric, a fake platform's inbox, a thread list) is polled here, in
:func:`until`: the one place the suite sleeps in order to wait. Its bound, :data:`WAIT`, is
generous on purpose: a machine at load 10 must not turn a pass into a failure, and a bound
reached is a failure that says what it waited for, never a pass.

A check that something did *not* happen first waits for a positive sign that it would have
happened by now (a later marker message answered, the next poll served, a log line written);
it never sleeps and then looks.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

WAIT = 60.0
"""Seconds any wait in the tests may take before it fails (generous: the machine may be busy)."""

_STEP = 0.005
"""First polling interval (seconds); it doubles up to :data:`_MAX_STEP`."""
_MAX_STEP = 0.05


async def until(predicate: Callable[[], object | Awaitable[object]],
                timeout: float = WAIT,  # noqa: ASYNC109 - the bound is the point
                what: str | None = None) -> None:
    """Return once ``predicate()`` is true (awaited first if it returns an awaitable, such as
    a query); ``TimeoutError`` (saying ``what``) after ``timeout`` seconds. Polls: the state
    it reads has no event to wait on."""
    step = _STEP

    async def holds() -> bool:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        return bool(value)

    try:
        async with asyncio.timeout(timeout):
            while not await holds():
                await asyncio.sleep(step)
                step = min(step * 2, _MAX_STEP)
    except TimeoutError as exc:
        raise TimeoutError(f"waited {timeout:g} s for {what or _name(predicate)}") from exc


async def until_progress(predicate: Callable[[], object], progress: Callable[[], object],
                         stall: float = WAIT, limit: float = 10 * WAIT,
                         what: str | None = None) -> None:
    """:func:`until` for a large amount of work (a thousand messages): ``TimeoutError`` only
    when ``progress()`` (a count of work done) has not changed for ``stall`` seconds, or after
    ``limit`` seconds in all. A busy machine slows the work down; a stuck one stops it, and
    only that is a failure."""
    loop = asyncio.get_running_loop()
    began = moved = loop.time()
    seen = progress()
    step = _STEP
    while not predicate():
        now = loop.time()
        if (done := progress()) != seen:
            seen, moved = done, now
        if now - moved >= stall or now - began >= limit:
            reason = f"no progress for {stall:g} s" if now - moved >= stall else \
                f"still progressing after {limit:g} s"
            raise TimeoutError(f"{reason} towards {what or _name(predicate)} (at {seen})")
        await asyncio.sleep(step)
        step = min(step * 2, _MAX_STEP)


def until_sync(predicate: Callable[[], object], timeout: float = WAIT,
               what: str | None = None) -> None:
    """:func:`until` for code outside an event loop (a thread, a synchronous test)."""
    deadline = time.monotonic() + timeout
    step = _STEP
    while not predicate():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"waited {timeout:g} s for {what or _name(predicate)}")
        time.sleep(step)
        step = min(step * 2, _MAX_STEP)


async def next_millisecond() -> None:
    """Return once the wall clock has moved past the current millisecond: records stamped
    from now on (``startedAt`` has millisecond precision) sort after those stamped before."""
    now = time.time_ns() // 1_000_000
    await until(lambda: time.time_ns() // 1_000_000 > now, what="the next millisecond")


def _name(predicate: Callable[[], object]) -> str:
    code = getattr(predicate, "__code__", None)
    if code is None:
        return repr(predicate)
    return f"{code.co_name} ({code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno})"
