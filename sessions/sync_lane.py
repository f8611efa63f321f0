"""The sync lane: group fsync of files, in one thread, waking the event loop once a round.

An ``fsync`` cannot run on the event loop (it waits for the disk), so it runs in a thread.
One thread hop per fsync is what that used to cost: every session's end-of-turn fsync and the
owed journal's went through ``asyncio.to_thread``, two hops a message. A hop is cheap on an
idle process; under load it is not: the worker thread must take the GIL from the event loop
after each system call it makes, and the loop then waits to get it back at its own next one.
Measured on the Telegram benchmark (20 chats, closed loop), those two fsyncs cost a fifth of
the gateway's CPU per message, most of it in the hand-offs rather than in the kernel.

So every fsync of a process's data directory goes to one lane: a caller names the descriptor
and waits; the lane's thread takes *every* descriptor asked for since its last round, syncs
each once, and wakes each waiting event loop once, for the whole round. Twenty conversations
ending their turns together cost one round, not twenty hops; a lone turn costs what it did.
Each waiter still returns only after an fsync of its descriptor that began after it asked
(its round starts after its request), which is all durability needs.

The thread starts with the first request and exits after a second with nothing to do. A hung
disk holds the lane (every later fsync waits behind it, as the disk would make them anyway);
callers bound their wait where it matters (:class:`sessions.jsonl_writer.JsonlSessionWriter`
through the recorder's persist timeout). Cancelling a wait never cancels the fsync: the
caller that owns the descriptor must wait for it before closing (a descriptor closed and
reused meanwhile would sync another file).
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Callable
from typing import Protocol

from sessions import wakeup

IDLE_EXIT = 1.0
"""Seconds the thread waits for a request before it exits (it restarts with the next one)."""

Waiters = list[tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]]


class FileSyncer(Protocol):
    """Makes a file durable; raises ``OSError`` (or waits) as the disk does."""

    async def sync(self, fd: int) -> None: ...


class SyncLane:
    """See the module docstring. ``sync_file``: the disk's fsync (the seam tests use to count,
    fail or hold it)."""

    def __init__(self, sync_file: Callable[[int], None] = os.fsync,
                 name: str = "sync-lane") -> None:
        self._sync_file = sync_file
        self._name = name
        self._wake = threading.Condition(threading.Lock())
        self._asked: dict[int, Waiters] = {}  # descriptor -> who waits for its next fsync
        self._running = False
        self.rounds = 0  # rounds run so far (tests and diagnostics)

    async def sync(self, fd: int) -> None:
        """Return once an fsync of ``fd`` that began after this call has ended; raise its
        ``OSError``."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        with self._wake:
            self._asked.setdefault(fd, []).append((loop, done))
            if self._running:
                self._wake.notify()
            else:
                self._running = True
                threading.Thread(target=self._run, name=self._name, daemon=True).start()
        await done

    def _run(self) -> None:
        while True:
            with self._wake:
                if not self._asked:
                    self._wake.wait(IDLE_EXIT)
                    if not self._asked:
                        self._running = False
                        return
                asked, self._asked = self._asked, {}
            self.rounds += 1
            outcomes: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[None],
                                                                 OSError | None]]] = {}
            for fd, waiters in asked.items():
                error: OSError | None = None
                try:
                    self._sync_file(fd)
                except OSError as exc:  # handed to each waiter, never lost in the thread
                    error = exc
                except Exception as exc:  # a seam's bug: the waiters must not hang on it
                    error = OSError(f"fsync failed: {exc!r}")
                for loop, done in waiters:
                    outcomes.setdefault(loop, []).append((done, error))
            for loop, settled in outcomes.items():
                wakeup.post(loop, functools.partial(_settle, settled))


def _settle(settled: list[tuple[asyncio.Future[None], OSError | None]]) -> None:
    """On the waiters' loop: hand each its outcome (one that stopped waiting is skipped)."""
    for done, error in settled:
        if done.done():
            continue
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(None)
