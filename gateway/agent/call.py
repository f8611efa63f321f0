"""One provider call of a turn, recorded before it is made, with fallbacks after overloads.

:class:`Caller` makes the calls the agent loop (:mod:`gateway.agent.loop`) and compaction
(:mod:`gateway.agent.compaction`) ask for. Every attempt takes the same fixed steps:

1. **record** the call through the caller's required :class:`~gateway.agent.recorder.
   CallRecorder` (failure-isolated: a failed write is logged once and counted, and the call
   goes on; a session fenced off by another worker stops it before anything is sent);
2. the other before-call hooks, an ordered list of awaited callables (none by default);
3. the **lease check** of the claim the turn serves, passed in by the caller
   (:data:`~gateway.edge.coordination.LeaseCheck`): nothing awaits between it and the send,
   so a lease cannot lapse unseen in between;
4. send the request, count it, price its usage.

When the provider is unavailable (5xx, 529 overloaded, no connection; after the SDK's own
retries) and a fallback is configured, the next provider/model in the list is tried: each
attempt is its own recorded call, the later ones with reason ``fallback`` and the failed call
they follow (``after``), so replay shows exactly what was tried. Other failures (rate limits,
timeouts, cut streams, bad requests) end the call at once: another model would not fix them,
or would answer twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from gateway.agent.conversation import Conversation
from gateway.agent.recorder import CallRecorder, PersistResult, SessionRecorder
from gateway.edge import logctx
from gateway.edge.coordination import LeaseCheck
from gateway.edge.errors import Failure, NotRecordedError, ProviderError, ProviderUnavailable
from gateway.edge.metrics import Metrics
from gateway.edge.observe import CallInfo, CallResult, TurnHandle
from gateway.edge.provider import Provider, ProviderRequest, ProviderResponse, TextSink
from gateway.usage.accounting import Accounting
from sessions import traces
from sessions.records import (
    NO_LINEAGE,
    CachePlan,
    CallRequest,
    Injected,
    Lineage,
    MessageDict,
    Outcome,
    Prompt,
    ToolSchema,
    Window,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CallContext:
    """What a before-call hook receives: the session's recorder, the request about to be
    sent, and what the persist step recorded of it."""

    recorder: SessionRecorder
    request: CallRequest
    persisted: PersistResult


BeforeCallHook = Callable[[CallContext], Awaitable[None]]
"""A hook run after the persist step, before the call (like httpx's event hooks); its
exception propagates and ends the turn."""


@dataclass(frozen=True, slots=True)
class CallSpec:
    """A call as its caller sees it: everything but the provider, which the attempts choose.

    ``messages`` are the messages sent (``window`` of the conversation, ``injected`` placed);
    ``stable`` the prompt's stable prefix (for cache breakpoints, when ``cacheable``).
    """

    prompt: Prompt
    reason: str
    tools: tuple[ToolSchema, ...]
    window: Window
    messages: Sequence[MessageDict]
    injected: tuple[Injected, ...] = ()
    blobs: Mapping[str, bytes] | None = None
    stable: int = 0
    cacheable: bool = True
    lineage: Lineage = NO_LINEAGE


@dataclass(frozen=True, slots=True)
class Answered:
    """The attempt that answered: its response, who answered, its recorded call index (None
    when the log refused the call), latency in seconds and cost (None: no price)."""

    response: ProviderResponse
    provider: Provider
    call: int | None
    latency: float
    cost: float | None

    def outcome(self, *, answer: MessageDict | None = None) -> Outcome | None:
        """The outcome entry of the answering call (None when the call was not recorded)."""
        if self.call is None:
            return None
        r = self.response
        return Outcome(call=self.call, stop_reason=r.stop_reason, usage=r.usage,
                       latency_ms=self.latency * 1000, response_id=r.response_id,
                       response_model=r.response_model, cost_usd=self.cost, answer=answer)


class Caller:
    """Makes recorded provider calls, the primary provider first, then each fallback.

    ``recorder`` is required: there is no caller that does not record (see the module
    docstring); ``hooks`` run after it, in order."""

    def __init__(self, providers: Sequence[Provider], recorder: CallRecorder,
                 metrics: Metrics, accounting: Accounting, *,
                 hooks: Sequence[BeforeCallHook] = (), prompt_cache: bool = True) -> None:
        if not providers:
            raise ValueError("a caller needs at least one provider")
        self.providers = tuple(providers)
        self.recorder = recorder
        self.hooks = tuple(hooks)
        self.metrics = metrics
        self.accounting = accounting
        self.prompt_cache = prompt_cache
        self.waited = 0.0
        """Seconds every call so far spent waiting for its provider (the turn limit reads it:
        :mod:`gateway.delivery.limit`)."""

    @property
    def primary(self) -> Provider:
        return self.providers[0]

    async def call(self, conv: Conversation, turn: TurnHandle, spec: CallSpec,
                   on_text: TextSink | None = None, *, lease: LeaseCheck) -> Answered:
        """Make the call; the answering attempt. Raises the last attempt's
        :class:`ProviderError` when none answered (each failure has its outcome recorded),
        :class:`NotRecordedError` before sending anything when the writer was fenced off, and
        whatever ``lease`` raises (:class:`~gateway.edge.coordination.LeaseLostError`) when
        the claim's lease may have lapsed, also before sending anything."""
        after: int | None = None
        for position, provider in enumerate(self.providers):
            lineage = spec.lineage
            if position:
                lineage = replace(lineage, reason=lineage.reason or "fallback", after=after)
            try:
                return await self._attempt(conv, turn, spec, provider, lineage, on_text, lease)
            except _Failed as failed:
                last = position == len(self.providers) - 1
                if last or not isinstance(failed.error, ProviderUnavailable):
                    raise failed.error from failed.error.__cause__
                after = failed.call
                log.warning("%s %s unavailable (%s); trying %s %s", provider.name,
                            provider.model, failed.error.kind, self.providers[position + 1].name,
                            self.providers[position + 1].model)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _attempt(self, conv: Conversation, turn: TurnHandle, spec: CallSpec,
                       provider: Provider, lineage: Lineage,
                       on_text: TextSink | None, lease: LeaseCheck) -> Answered:
        params = dict(provider.params())
        cache = self._cache_plan(provider, spec)
        request = CallRequest(
            prompt=spec.prompt, reason=spec.reason, tools=spec.tools, provider=provider.name,
            model=provider.model, params=params, window=spec.window, injected=spec.injected,
            cache=cache, lineage=lineage, endpoint=provider.endpoint, inbound=conv.inbound,
        )
        number = conv.recorder.next_call + 1  # 1-based, as the log will number it
        with logctx.bound(call=number):
            persisted = await self.recorder.record_call(conv.recorder, request)
            if persisted.fenced:
                raise NotRecordedError(conv.session_id, persisted.failure or Failure.FENCED)
            if persisted.call is not None:  # the call's span, as its trace names it
                logctx.extend(span_id=traces.call_span_id(conv.key.tenant, conv.session_id,
                                                          persisted.call))
            if self.hooks:
                context = CallContext(conv.recorder, request, persisted)
                for hook in self.hooks:
                    await hook(context)
            lease()  # the last step before the send: nothing awaits from here to the call
            sent = ProviderRequest(
                system=spec.prompt.text, messages=spec.messages, tools=spec.tools,
                model=provider.model, params=params, sections=spec.prompt.texts, cache=cache,
                blobs=spec.blobs or {},
            )
            observed = turn.call_started(CallInfo(
                index=number, provider=provider.name, model=sent.model, params=params,
                system=sent.system, messages=sent.messages, tools=sent.tools,
                entry=persisted.call))
            started = time.perf_counter()
            try:
                response = await provider.complete(sent, on_text=on_text)
            except ProviderError as exc:
                latency = time.perf_counter() - started
                self._count(provider, "error", latency)
                observed.finished(CallResult(latency=latency, error=exc.kind))
                log.warning("provider call failed (%s)", exc.kind)
                if persisted.call is not None:  # outcomes belong to recorded calls only
                    await conv.add_outcome(Outcome(
                        call=persisted.call, latency_ms=latency * 1000,
                        error={"kind": exc.kind, "message": _safe(str(exc))},
                    ))
                raise _Failed(exc, persisted.call) from exc
            except BaseException as exc:  # cancelled or a bug: the span still ends
                observed.finished(CallResult(latency=time.perf_counter() - started,
                                             error=type(exc).__name__))
                raise
            latency = time.perf_counter() - started
            self._count(provider, "ok", latency)
            observed.finished(CallResult(
                latency=latency, message=response.message, stop_reason=response.stop_reason,
                usage=response.usage, response_id=response.response_id,
                response_model=response.response_model))
        cost = await self.accounting.charge(key=conv.key, context=conv.context,
                                            provider=provider.name, model=provider.model,
                                            usage=response.usage)
        return Answered(response, provider, persisted.call, latency, cost)

    def _cache_plan(self, provider: Provider, spec: CallSpec) -> CachePlan | None:
        """Breakpoints after the tools, the prompt's stable prefix and the history; only the
        Anthropic shape takes them (OpenAI caches prefixes by itself)."""
        if not (self.prompt_cache and spec.cacheable) or provider.shape != "anthropic":
            return None
        return CachePlan(tools=bool(spec.tools),
                         system=min(spec.stable, len(spec.prompt.sections)))

    def _count(self, provider: Provider, outcome: str, latency: float) -> None:
        self.waited += latency
        labels = {"provider": provider.name, "model": provider.model, "outcome": outcome}
        self.metrics.provider_calls.labels(**labels).inc()
        self.metrics.provider_latency.labels(**labels).observe(latency)


class _Failed(Exception):
    """One attempt's failure, with the call index it was recorded under."""

    def __init__(self, error: ProviderError, call: int | None) -> None:
        super().__init__(str(error))
        self.error = error
        self.call = call


def _safe(text: str, limit: int = 300) -> str:
    """Error text for the log: bounded (provider messages never carry our keys)."""
    return text[:limit]
