"""Every provider call takes the same fixed steps: recorded, the other hooks, the lease check of
the claim being served, then the send; and no caller can be built without its recorder."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from mypy import api as mypy_api

from coordination.keys import decode_item
from coordination.local import LocalConversations
from gateway.agent.call import CallContext
from gateway.edge.coordination import Claim, LeaseLostError
from sessions.jsonl import JsonlSessionStore
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.harness import running_core
from tests.waiting import WAIT

ROOT = Path(__file__).resolve().parents[2]


class WatchedLease(LocalConversations):
    """The in-process queue, noting each lease check (and failing them when told to)."""

    def __init__(self, seen: list[str], *, lost: bool = False) -> None:
        super().__init__()
        self.seen = seen
        self.lost = lost
        self.checked = asyncio.Event()

    def check(self, claim: Claim) -> None:
        self.seen.append(f"lease:{claim.key.label()}")
        self.checked.set()
        if self.lost:
            raise LeaseLostError(f"lease on {claim.key.label()} lapsed")
        super().check(claim)


async def test_recorded_then_hooks_then_the_claims_lease_then_the_provider(
        tmp_path: Path) -> None:
    """The call entry is in the log before any other hook runs (the first one reads it back),
    the hooks run in order and see the recorded call's number, the served claim's lease is
    checked after them, and only then is the provider called."""
    seen: list[str] = []
    store = JsonlSessionStore(tmp_path / "d")

    class Spy(ScriptedProvider):
        async def complete(self, request: Any, on_text: Any = None) -> Any:
            seen.append("provider")
            return await super().complete(request, on_text)

    async def first(context: CallContext) -> None:
        data = await store.read_log("default", context.recorder.session_id)
        seen.append("call-on-disk" if b'"type":"call"' in data else "call-missing")
        seen.append(f"hook-1:call {context.persisted.call}")

    async def second(context: CallContext) -> None:
        seen.append("hook-2")

    async with running_core(store, Spy(), tmp_path / "p", hooks=[first, second],
                            conversations=WatchedLease(seen)) as core:
        await core.channel.say("c1", "hi")
        await core.channel.wait_replies(1)
    assert seen == ["call-on-disk", "hook-1:call 0", "hook-2", "lease:memory:c1", "provider"]


async def test_a_lapsed_lease_stops_the_call_before_the_provider(tmp_path: Path) -> None:
    """A holder whose lease may have lapsed never calls the provider: the call is recorded
    (before the check, as every call is), nothing is sent or answered, and the message stays
    owed for whoever holds the conversation next."""
    seen: list[str] = []
    store = JsonlSessionStore(tmp_path / "d")
    provider = ScriptedProvider()
    queue = WatchedLease(seen, lost=True)
    async with running_core(store, provider, tmp_path / "p", conversations=queue) as core:
        accepted = await core.channel.say("c1", "hi")
        async with asyncio.timeout(WAIT):
            await queue.checked.wait()
        await core.idle()  # the worker ends after the check
        owed = [decode_item(o.item).item.inbound.text for o in queue.journal.owed()]
        assert accepted is not None
        assert accepted.session_id
        log = await store.read_log("default", accepted.session_id)
    assert seen == ["lease:memory:c1"]
    assert provider.bodies == []
    assert core.channel.replies == []
    assert owed == ["hi"]
    assert log.count(b'"type":"call"') == 1


SNIPPET = """\
from gateway.agent.call import Caller
from gateway.agent.recorder import SESSION_LOG
from gateway.edge.metrics import Metrics
from gateway.edge.provider import Provider
from gateway.usage.accounting import Accounting


def build(providers: list[Provider], metrics: Metrics) -> None:
    Caller(providers, SESSION_LOG, metrics, Accounting(metrics))
    Caller(providers, metrics=metrics, accounting=Accounting(metrics))
    Caller(providers, None, metrics, Accounting(metrics))
    Caller(providers, object(), metrics, Accounting(metrics))
"""


def test_a_caller_without_a_recorder_does_not_type_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """mypy (strict, the project's settings) accepts a caller given the gateway's recorder
    and rejects one built without a recorder, or with something that is not one."""
    snippet = tmp_path / "snippet.py"
    snippet.write_text(SNIPPET)
    monkeypatch.chdir(ROOT)  # our packages are found from the project's root
    # Third-party packages are left out (Any) to keep the check to a few seconds: what is
    # checked is our signature, not the libraries'.
    out, _, status = mypy_api.run([
        "--no-incremental", "--cache-dir=/dev/null", "--no-site-packages",
        "--ignore-missing-imports", "--follow-imports=silent", "--no-error-summary",
        str(snippet)])
    errors = [line.split(": error: ", 1) for line in out.splitlines()]
    assert status == 1
    assert [(where.rsplit(":", 1)[1], what) for where, what in errors] == [
        ("10", 'Missing positional argument "recorder" in call to "Caller"  [call-arg]'),
        ("11", 'Argument 2 to "Caller" has incompatible type "None"; '
               'expected "CallRecorder"  [arg-type]'),
        ("12", 'Argument 2 to "Caller" has incompatible type "object"; '
               'expected "CallRecorder"  [arg-type]'),
    ]
