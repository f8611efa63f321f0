"""Property: under any schedule of storage faults, replay never offers a wrong request body.

Hypothesis draws a conversation (each message answered with text, a tool round, or a tool
input plain JSON encoders refuse) and a fault schedule over the appends the gateway makes,
in order: each may be written, accepted and then fail to be written (``ENOSPC``, ``EIO``),
hang past the persist timeout, or be refused (an encoder error, a broken or closed writer);
and the process may crash after any message (restarted on the same store). The run ends with
the storage healthy and one clean turn. Then, for every call the provider received: replay's
body equals it, or replay says it cannot rebuild it (and offers no body). A crash may cut off
the calls its process had not written, only as a whole suffix of that process's calls.

``make test`` draws 100 examples (seed printed by Hypothesis on failure); ``make trials``
draws 400 (:mod:`tests.trials`).
"""

from __future__ import annotations

import asyncio
import errno
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.edge.errors import UnavailableError
from sessions.replay import Replay, replay_bytes
from tests.fakes.scripted_provider import ScriptedProvider
from tests.fakes.store import Fault, FaultyStore, Refuse
from tests.gateway.harness import running_core
from tests.reliability.calls import check_calls
from tests.trials import sized

TIMEOUT = 0.02
FAULTS: dict[str, Fault] = {
    "ENOSPC": OSError(errno.ENOSPC, "No space left on device"),
    "EIO": OSError(errno.EIO, "Input/output error"),
    "timeout": "hang",
    "encode error": Refuse("ENCODE"),
    "broken": Refuse("BROKEN"),
    "closed": Refuse("CLOSED"),
}
ODD: dict[str, Any] = {"big": 2**70 + 3, "half_emoji": "\ud83d", "nan": float("nan")}

answers = st.sampled_from(["text", "tool round", "odd tool round"])
faults = st.one_of(st.none(), st.none(), st.sampled_from(sorted(FAULTS)))


@dataclass
class Schedule:
    """Faults for the gateway's appends, in order (then none), and what was applied."""

    faults: Iterator[str | None]
    applied: list[str] = field(default_factory=list)

    def __call__(self, items: Sequence[Mapping[str, Any]]) -> Fault:
        name = next(self.faults, None)
        if name is None:
            return None
        self.applied.append(name)
        return FAULTS[name]


def script(provider: ScriptedProvider, answer: str, n: int) -> None:
    if answer == "text":
        provider.script(f"answer {n}")
        return
    args = ODD if answer == "odd tool round" else {"query": f"q{n}"}
    provider.script({"role": "assistant", "content": [
        {"type": "text", "text": "looking"},
        {"type": "tool_use", "id": f"t{n}", "name": "kb_search", "input": args}]},
        f"answer {n}")


async def run(plan: list[str], schedule: Schedule, crashes: set[int], root: Path) -> None:
    store = FaultyStore()
    store.decide = schedule
    provider = ScriptedProvider()
    epochs: list[tuple[int, int]] = []  # per process: (first call, turns the log then held)
    messages = iter(enumerate(plan))
    done = False
    while not done:
        first_call = len(provider.bodies)
        async with running_core(store, provider, root / "persona",
                                persist_timeout=TIMEOUT) as core:
            replies = 0
            for n, answer in messages:
                script(provider, answer, n)
                try:
                    await core.channel.say("c1", f"message {n}")
                except UnavailableError:  # refused on receipt: not acknowledged, no turn
                    continue
                replies += 1
                await core.channel.wait_replies(replies)
                if n in crashes:
                    store.crash()
                    break
            else:
                store.decide = None  # healthy again: one clean turn writes what is pending
                await core.channel.say("c1", "the end")
                await core.channel.wait_replies(replies + 1)
                done = True
        epochs.append((first_call, len((await log_of(store)).calls)))

    replay = await log_of(store)
    assert replay.problems == ()
    calls_end = [*(first for first, _ in epochs[1:]), len(provider.bodies)]
    turns_start = 0
    for (first_call, held), end_call in zip(epochs, calls_end, strict=True):
        kept = held - turns_start
        # A process's turns stand for its first calls, in order; only a crash loses the rest.
        assert kept <= end_call - first_call
        check_calls(replay, replay.calls[turns_start:held],
                    provider.bodies[first_call:first_call + kept])
        turns_start = held
    # The last process ended healthy: every one of its calls has its turn.
    last_first, last_held = epochs[-1]
    previous = epochs[-2][1] if len(epochs) > 1 else 0
    assert last_held - previous == len(provider.bodies) - last_first


async def log_of(store: FaultyStore) -> Replay:
    """The replay of the conversation's one session."""
    (info,) = await store.list_sessions("default")
    return replay_bytes(await store.read_log("default", info.session_id))


@settings(max_examples=sized(ci=100, full=400), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(plan=st.lists(answers, min_size=1, max_size=4),
       drawn=st.lists(faults, max_size=24),
       crashes=st.sets(st.integers(0, 3), max_size=2))
def test_replay_never_offers_a_wrong_body_under_any_fault_schedule(
    plan: list[str], drawn: list[str | None], crashes: set[int]
) -> None:
    """For random conversations and fault schedules (ENOSPC, EIO, timeout, encode error,
    refusal, crash), every call the provider received replays exactly or is said not to."""
    schedule = Schedule(iter(drawn))
    with tempfile.TemporaryDirectory() as root:
        asyncio.run(run(plan, schedule, crashes, Path(root)))


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_each_fault_kind_hits_each_write_of_a_conversation(name: str) -> None:
    """Enumerated, not drawn: each fault kind hits each append of a conversation with a tool
    round in turn (with and without a crash after it); every call replays exactly or is said
    not to."""
    plan = ["tool round", "text"]
    for position in range(9):
        for crashes in (set(), {0}):
            drawn: list[str | None] = [None] * position + [name]
            with tempfile.TemporaryDirectory() as root:
                asyncio.run(run(plan, Schedule(iter(drawn)), crashes, Path(root)))
