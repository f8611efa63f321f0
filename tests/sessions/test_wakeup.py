"""Results handed from worker threads to a busy loop share one wake-up, in order."""

from __future__ import annotations

import asyncio
import functools
import gc
import threading
import weakref

from sessions import wakeup


class CountingLoop(asyncio.SelectorEventLoop):
    """A loop that counts its thread-safe wake-ups."""

    wakeups = 0

    def call_soon_threadsafe(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.wakeups += 1
        return super().call_soon_threadsafe(*args, **kwargs)


def test_results_posted_while_the_loop_is_busy_share_one_wake_up() -> None:
    async def main() -> tuple[list[int], int, int]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, CountingLoop)
        ran: list[int] = []
        before = loop.wakeups

        def worker(numbers: range) -> None:
            for n in numbers:
                wakeup.post(loop, functools.partial(ran.append, n))

        thread = threading.Thread(target=worker, args=(range(5),))
        thread.start()
        thread.join()  # the loop's thread is busy (here) while all five are posted
        for _ in range(10):
            await asyncio.sleep(0)
        busy = loop.wakeups - before
        worker(range(5, 6))  # posted from the loop's own thread: still one wake-up
        for _ in range(10):
            await asyncio.sleep(0)
        return ran, busy, loop.wakeups - before - busy

    with asyncio.Runner(loop_factory=CountingLoop) as runner:
        ran, busy, after = runner.run(main())
    assert ran == [0, 1, 2, 3, 4, 5]
    assert (busy, after) == (1, 1)


def test_a_closed_loop_drops_what_is_posted_to_it() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    ran: list[int] = []
    wakeup.post(loop, functools.partial(ran.append, 1))
    wakeup.post(loop, functools.partial(ran.append, 2))
    assert ran == []


def test_a_failing_callback_does_not_strand_the_ones_after_it() -> None:
    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        ran: list[int] = []

        def broken() -> None:
            raise ValueError("bug")

        def worker() -> None:
            wakeup.post(loop, broken)
            wakeup.post(loop, functools.partial(ran.append, 1))

        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        for _ in range(10):
            await asyncio.sleep(0)
        return ran

    assert asyncio.run(main()) == [1]


def test_a_finished_loop_is_not_kept_alive_by_its_mailbox() -> None:
    loop = asyncio.new_event_loop()
    wakeup.post(loop, lambda: None)
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    gone = weakref.ref(loop)
    del loop
    gc.collect()
    assert gone() is None
