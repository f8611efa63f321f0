"""The turn limit (``GATEWAY_MAX_CONCURRENT_TURNS``): derived from the model's latency over
the CPU a turn costs, or fixed; turns past it wait in arrival order, a raised limit admits
them, a lowered one admits nobody until the running turns drop below it."""

from __future__ import annotations

import asyncio

import pytest

from gateway.delivery.limit import CEILING, HEADROOM, TurnLimit


class Clocks:
    """The process's CPU seconds and the seconds spent waiting for the model, as the test
    says they went."""

    def __init__(self) -> None:
        self.cpu = 0.0
        self.waited = 0.0

    def turns(self, limit: TurnLimit, count: int, *, cpu: float, model: float) -> None:
        """``count`` turns ended, each having cost ``cpu`` and waited ``model`` seconds."""
        for _ in range(count):
            self.cpu += cpu
            self.waited += model
            limit.observe()


def derived(clocks: Clocks, **options: int) -> TurnLimit:
    return TurnLimit(None, waited=lambda: clocks.waited, cpu=lambda: clocks.cpu, window=10,
                     **options)


def test_a_derived_limit_is_the_models_latency_over_the_cpu_a_turn_costs() -> None:
    """Turns waiting 5 s on the model at 3 ms of CPU each: about 1,700 keep the CPU busy, and
    the limit is that (with headroom); it follows when the model gets faster, and stays
    within its floor and ceiling."""
    clocks = Clocks()
    limit = derived(clocks)
    assert limit.limit == 256  # nothing measured yet
    clocks.turns(limit, 9, cpu=0.003, model=5.0)
    assert limit.limit == 256  # the window is not full yet
    clocks.turns(limit, 1, cpu=0.003, model=5.0)
    assert limit.limit == pytest.approx(5.0 / 0.003 * HEADROOM, abs=1)
    clocks.turns(limit, 10, cpu=0.003, model=2.5)
    assert limit.limit == pytest.approx(2.5 / 0.003 * HEADROOM, abs=1)
    clocks.turns(limit, 10, cpu=0.0001, model=10.0)
    assert limit.limit == CEILING
    clocks.turns(limit, 10, cpu=0.01, model=0.01)
    assert limit.limit == 64  # the floor


def test_a_fixed_limit_stays_what_it_was_set_to() -> None:
    """A number is the limit, whatever is measured."""
    clocks = Clocks()
    limit = TurnLimit(32, waited=lambda: clocks.waited, cpu=lambda: clocks.cpu, window=10)
    clocks.turns(limit, 50, cpu=0.003, model=5.0)
    assert limit.limit == 32
    with pytest.raises(ValueError, match="at least 1"):
        TurnLimit(0)


async def enter(limit: TurnLimit, name: str, log: list[str],
                leave: asyncio.Event) -> None:
    async with limit:
        log.append(name)
        await leave.wait()


async def settle() -> None:
    for _ in range(20):  # the waiting tasks run as far as they can
        await asyncio.sleep(0)


async def test_turns_past_the_limit_wait_in_order_and_a_raised_limit_admits_them() -> None:
    """With room for two, the third and fourth wait; once the limit is derived higher, both
    are admitted, in the order they came."""
    clocks = Clocks()
    limit = derived(clocks, start=2, floor=2)
    leave, log = asyncio.Event(), []
    tasks = [asyncio.create_task(enter(limit, n, log, leave)) for n in "abcd"]
    await settle()
    assert (log, limit.running, limit.waiting) == (["a", "b"], 2, 2)
    clocks.turns(limit, 10, cpu=0.001, model=0.004)  # 4 / 1 x 1.25 -> 5
    await settle()
    assert (log, limit.limit, limit.running) == (["a", "b", "c", "d"], 5, 4)
    leave.set()
    await asyncio.gather(*tasks)
    assert limit.running == 0


async def test_a_lowered_limit_admits_nobody_until_the_running_turns_drop_below_it() -> None:
    """Four run under a limit of four; it is lowered to two: a fifth waits until three have
    left, not one."""
    clocks = Clocks()
    limit = derived(clocks, start=4, floor=2)
    leaves = [asyncio.Event() for _ in range(5)]
    log: list[str] = []
    tasks = [asyncio.create_task(enter(limit, str(n), log, leaves[n])) for n in range(4)]
    await settle()
    clocks.turns(limit, 10, cpu=0.001, model=0.001)  # 1 x 1.25 -> 2 (the floor)
    tasks.append(asyncio.create_task(enter(limit, "4", log, leaves[4])))
    admitted = []
    for n in range(4):
        leaves[n].set()
        await settle()
        admitted.append("4" in log)
    assert admitted == [False, False, True, True]
    leaves[4].set()
    await asyncio.gather(*tasks)


async def test_a_waiter_cancelled_as_it_is_admitted_passes_its_slot_on() -> None:
    """A waiting turn admitted and cancelled before it ran gives its slot to the next one
    rather than keep it."""
    limit = TurnLimit(1)
    await limit.__aenter__()  # a runs
    second = asyncio.create_task(limit.__aenter__())
    third = asyncio.create_task(limit.__aenter__())
    await settle()
    assert limit.waiting == 2
    await limit.__aexit__(None, None, None)  # a leaves: b is admitted ...
    second.cancel()  # ... and cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await second
    await third  # c has the slot
    assert (limit.running, limit.waiting) == (1, 0)
    await limit.__aexit__(None, None, None)
    assert limit.running == 0
