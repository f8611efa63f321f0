"""Before-provider-call hooks: an ordered list of awaited callables (like httpx event hooks).

Each hook sees the exact request parts of the call about to be made. Hooks run in order and
the call starts only after the last one returns. A hook's exception propagates and ends the
turn, with one exception by design: the prompt-persist hook, which is failure-isolated in
:class:`gateway.agent.recorder.SessionRecorder` (its error or timeout is logged once and counted,
and
the call proceeds). The prompt-persist hook returns what it recorded (a
:class:`~gateway.agent.recorder.PersistResult`); other hooks return ``None``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from gateway.agent.recorder import NO_PERSIST_HOOK, PersistResult, SessionRecorder
from sessions.records import CallRequest


@dataclass(frozen=True, slots=True)
class CallContext:
    """What a hook receives: the session's recorder and the request about to be sent."""

    recorder: SessionRecorder
    request: CallRequest


BeforeCallHook = Callable[[CallContext], Awaitable[PersistResult | None]]


async def prompt_persist_hook(context: CallContext) -> PersistResult:
    """Write what the provider is about to receive into the session log (failure-isolated)."""
    return await context.recorder.persist(context.request)


async def run_hooks(hooks: Sequence[BeforeCallHook], context: CallContext) -> PersistResult:
    """Run every hook in order; what the prompt-persist hook recorded (``NO_PERSIST_HOOK``
    when none ran)."""
    persisted = NO_PERSIST_HOOK
    for hook in hooks:
        result = await hook(context)
        if result is not None:
            persisted = result
    return persisted
