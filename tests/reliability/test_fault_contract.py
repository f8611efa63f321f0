"""One fault suite, three stores: the fake, JSONL files and PostgreSQL fail alike and recover
alike, and after recovery replay rebuilds every call the provider received.

Each scenario drives the real agent loop (router, registry, recorder, the persist step)
with a scripted provider over the backend's store: a warm-up turn, two turns (one with a tool
round) while the storage fails (``ENOSPC``, ``EIO``), hangs past the persist timeout, or while
the provider answers with values plain JSON encoders refuse (``encode``), then recovery and one
more turn. Writes that fail are accepted and written ahead of later ones (the SessionWriter
contract), so after recovery every call must replay exactly. In ``crash`` the process dies
while writes fail: what it had not written is lost (a whole suffix of calls, never a part),
the restarted gateway carries on from the log, and every call the log kept replays exactly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sessions.replay import Replay, replay_bytes
from sessions.scan import message_text
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.harness import Core, running_core
from tests.reliability.calls import check_calls
from tests.reliability.fault_backends import (
    Backend,
    FakeBackend,
    JsonlBackend,
    PostgresBackend,
)
from tests.sessions.pg import fresh_schema

TIMEOUT = 0.3
BACKENDS = ["fake", "jsonl", pytest.param("postgres", marks=pytest.mark.services)]
ODD = {"big": 2**70 + 1, "half_emoji": "\ud83d", "nan": float("nan")}


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "fake":
        yield FakeBackend()
    elif request.param == "jsonl":
        jsonl = JsonlBackend(tmp_path / "data", stall_after=TIMEOUT)
        try:
            yield jsonl
        finally:
            await jsonl.aclose()
    else:
        async with fresh_schema() as schema:
            pg = await PostgresBackend.connect(schema)
            try:
                yield pg
            finally:
                await pg.aclose()


def tool_use(args: dict[str, Any], id_: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [
        {"type": "text", "text": "let me look"},
        {"type": "tool_use", "id": id_, "name": "kb_search", "input": args}]}


async def turn(core: Core, text: str, answered: int) -> str:
    """Say ``text`` in the conversation and wait for its reply; the session id."""
    accepted = await core.channel.say("c1", text)
    replies = await core.channel.wait_replies(answered)
    assert replies[-1][1] == "finish", replies[-1]
    assert accepted is not None
    assert accepted.session_id
    return accepted.session_id


def failures(core: Core) -> float:
    return sum(s.value for m in core.metrics.persist_failures.collect()
               for s in m.samples if s.name.endswith("_total"))


async def replay_of(backend: Backend, session: str) -> Replay:
    return replay_bytes(await backend.store.read_log("default", session))


@pytest.mark.parametrize("fault", ["ENOSPC", "EIO", "hang", "encode"])
async def test_storage_fault_then_recovery_replays_every_call(
    backend: Backend, fault: str, tmp_path: Path
) -> None:
    """While writes fail, hang or meet values JSON encoders refuse, every turn is answered and
    counted; after recovery the log holds every call, and each replays to its exact body."""
    provider = ScriptedProvider()
    async with running_core(backend.store, provider, tmp_path / "p",
                            persist_timeout=TIMEOUT) as core:
        session = await turn(core, "warm up", 1)
        before = failures(core)
        if fault == "encode":
            provider.script(tool_use(ODD, "t1"), "found it")
        else:
            provider.script(tool_use({"query": "tea"}, "t1"), "found it")
            await backend.fail(fault)
        await turn(core, "during one", 2)
        await turn(core, "during two", 3)
        during = failures(core) - before
        await backend.recover()
        await turn(core, "after", 4)
        assert len(provider.bodies) == 5
    replay = await replay_of(backend, session)
    assert replay.problems == ()
    assert [g.kind for g in replay.gaps] == []
    check_calls(replay, replay.calls, provider.bodies, all_rebuilt=True)
    assert (during > 0) == (fault != "encode")


async def test_crash_while_writes_fail_loses_a_suffix_and_carries_on(
    backend: Backend, tmp_path: Path
) -> None:
    """Killed while its writes fail, the gateway loses what it had not written (whole calls,
    at the end); restarted, it continues from the log and every kept call replays exactly."""
    provider = ScriptedProvider()
    async with running_core(backend.store, provider, tmp_path / "p",
                            persist_timeout=TIMEOUT) as core:
        session = await turn(core, "warm up", 1)
        await backend.fail("EIO")
        provider.script(tool_use({"query": "doomed"}, "t1"), "doomed answer")
        await turn(core, "doomed", 2)
        await backend.crash()
    died_after = len(provider.bodies)
    await backend.recover()  # the storage is fine again when the new process starts
    store = await backend.restart()
    kept = replay_bytes(await store.read_log("default", session))
    async with running_core(store, provider, tmp_path / "p", persist_timeout=TIMEOUT) as core:
        assert await turn(core, "after the crash", 1) == session
    replay = await replay_of(backend, session)

    assert died_after == 3
    assert len(kept.calls) == 1  # the warm-up; the doomed turn's writes never landed
    assert replay.problems == ()
    survivors = len(kept.calls)
    check_calls(replay, replay.calls[:survivors], provider.bodies[:survivors], all_rebuilt=True)
    check_calls(replay, replay.calls[survivors:], provider.bodies[died_after:], all_rebuilt=True)
    # The restarted gateway sees the conversation as the log has it: no trace of "doomed".
    sent = provider.bodies[-1]["messages"]
    assert [message_text(m["content"]) for m in sent if m["role"] == "user"] == [
        "warm up", "after the crash"]
