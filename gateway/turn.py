"""The agent loop: one turn = provider calls and tool runs until a final answer.

Words used everywhere: a **turn** answers one inbound message; a **call** is one provider
request (a turn with a tool round makes two or more calls). Per iteration: refresh the
system prompt (cheap when unchanged), choose the message window, run the before-call hooks
(the prompt-persist hook among them), call the provider, record the answer, run the tools it
asked for, record their results. The loop knows nothing about
platforms or files: channel sink, store (through the conversation's recorder), provider, prompt
source and tools are all injected. What tracers see goes through the observer seam
(:mod:`gateway.observe`); the log context (:mod:`gateway.logctx`) names the tenant, channel,
conversation and session for the whole turn and the call number during each call.

Streamed text and the final reply agree: the final joins the calls' texts with a blank line,
so a call whose text follows an earlier call's text streams that blank line first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway import logctx
from gateway.accounting import Accounting
from gateway.channel import ReplySink
from gateway.conversation import Conversation
from gateway.errors import FENCED, NotRecordedError, ProviderError
from gateway.hooks import BeforeCallHook, CallContext, run_hooks
from gateway.metrics import Metrics
from gateway.observe import (
    NO_OBSERVER,
    CallResult,
    TurnHandle,
    TurnInfo,
    TurnObserver,
)
from gateway.observe import CallInfo as ObservedCall
from gateway.prompt import BuiltPrompt, PromptSource
from gateway.providers.base import Provider, ProviderRequest, TextSink
from gateway.tools import ToolRegistry, ToolSet, run_tool_uses
from sessions.attachments import needed
from sessions.blobs import BlobStore, load
from sessions.records import CachePlan, CallRequest, Outcome, window_messages
from sessions.scan import message_text

log = logging.getLogger("gateway.turn")

APOLOGY = "Sorry, I couldn't reach my language model just now. Please try again in a moment."
CAPPED = "I stopped after too many steps without a final answer."
"""The answer of a turn stopped at the iteration cap without any text."""
SEPARATOR = "\n\n"
"""Between the texts of a turn's calls, in the final reply and in the stream alike."""


@dataclass(frozen=True, slots=True)
class LoopSettings:
    max_iterations: int = 8
    window_tokens: int = 16_000
    apology: str = APOLOGY
    prompt_cache: bool = True
    """Place prompt-cache breakpoints in Anthropic-shaped requests (:mod:`sessions.caching`)."""


@dataclass(frozen=True, slots=True)
class TurnResult:
    """How a turn ended: ``answered``, ``apologised``, ``iteration_cap`` or ``not_recorded``
    (the log refused the answer or its tool results, so the turn stopped there)."""

    status: str
    text: str
    calls: int


class AgentLoop:
    """Runs turns. Shared by every conversation; holds no per-conversation state."""

    def __init__(
        self,
        *,
        provider: Provider,
        prompts: PromptSource,
        tools: ToolRegistry,
        hooks: Sequence[BeforeCallHook],
        metrics: Metrics,
        settings: LoopSettings | None = None,
        observer: TurnObserver = NO_OBSERVER,
        accounting: Accounting | None = None,
        blobs: BlobStore | None = None,
    ) -> None:
        self.provider = provider
        self.prompts = prompts
        self.tools = tools
        self.hooks = tuple(hooks)
        self.metrics = metrics
        self.settings = settings or LoopSettings()
        self.observer = observer
        self.accounting = accounting or Accounting(metrics)
        self.blobs = blobs
        """Where attachment bytes are read from at send time (None: no attachments)."""

    async def run_turn(self, conv: Conversation, inbound_index: int, sink: ReplySink) -> TurnResult:
        """Answer the inbound message recorded at ``inbound_index`` (already in the log).

        Raises :class:`~gateway.errors.NotRecordedError` (``fenced``) before any provider call
        when the session's writer was fenced off: another worker owns the conversation now.
        """
        key = conv.key
        info = TurnInfo(tenant=key.tenant, channel=key.channel, conversation=key.label(),
                        session=conv.session_id)
        with logctx.bound(tenant=info.tenant, channel=info.channel,
                          conversation=info.conversation, session=info.session):
            turn = self.observer.turn_started(info)
            started = time.perf_counter()
            status = "error"
            try:
                result = await self._run(conv, inbound_index, sink, turn)
                status = result.status
                return result
            except asyncio.CancelledError:
                status = "cancelled"
                raise
            finally:
                latency = time.perf_counter() - started
                self.metrics.turn_latency.labels(channel=info.channel,
                                                 outcome=status).observe(latency)
                turn.finished(status, latency)
                log.debug("turn %s in %.0f ms", status, latency * 1000)

    async def _run(self, conv: Conversation, inbound_index: int, sink: ReplySink,
                   turn: TurnHandle) -> TurnResult:
        conv.begin(inbound_index)
        await sink.typing()
        texts: list[str] = []
        calls = 0
        for _ in range(self.settings.max_iterations):
            calls += 1
            built = await self.prompts.build(conv.context)
            prompt = built.prompt
            # The reason is written only with a prompt the log has not seen yet (persist_call
            # compares with the log's last prompt, the one owner of "last prompt").
            reason = "initial" if conv.recorder.last_prompt is None else f"rebuilt:{built.cause}"
            window = conv.order.choose(conv.messages, self.settings.window_tokens)
            messages = window_messages(conv.messages, window)
            blobs = await self._blobs(conv, messages)
            if blobs is None:  # never send (or record) a call whose attachments are gone
                await sink.fail(self.settings.apology)
                await conv.recorder.sync()
                return TurnResult("apologised", self.settings.apology, calls)
            params = dict(self.provider.params())
            tools = self.tools.for_tenant(conv.key.tenant)
            cache = self._cache_plan(built, tools)
            request = CallRequest(
                prompt=prompt, reason=reason, tools=tools.schemas,
                provider=self.provider.name, model=self.provider.model, params=params,
                window=window, cache=cache,
            )
            number = conv.recorder.next_call + 1  # 1-based, as the log will number it
            with logctx.bound(call=number):
                persisted = await run_hooks(self.hooks, CallContext(conv.recorder, request))
                if persisted.fenced:
                    raise NotRecordedError(conv.session_id, persisted.failure or FENCED)
                sent = ProviderRequest(
                    system=prompt.text,
                    messages=messages,
                    tools=tools.schemas,
                    model=self.provider.model,
                    params=params,
                    sections=prompt.texts,
                    cache=cache,
                    blobs=blobs,
                )
                observed = turn.call_started(ObservedCall(
                    index=number, provider=self.provider.name, model=sent.model,
                    params=params, system=sent.system, messages=sent.messages,
                    tools=sent.tools))
                started = time.perf_counter()
                try:
                    response = await self.provider.complete(
                        sent, on_text=_separated(sink, first=not texts))
                except ProviderError as exc:
                    latency = time.perf_counter() - started
                    self._count_call("error", latency)
                    observed.finished(CallResult(latency=latency, error=exc.kind))
                    log.warning("provider call failed (%s)", exc.kind)
                    if persisted.call is not None:  # outcomes belong to recorded calls only
                        await conv.add_outcome(Outcome(
                            call=persisted.call, latency_ms=latency * 1000,
                            error={"kind": exc.kind, "message": _safe(str(exc))},
                        ))
                    return await self._end(conv, sink, "apologised", "", calls)
                except BaseException as exc:  # cancelled or a bug: the span still ends
                    observed.finished(CallResult(latency=time.perf_counter() - started,
                                                 error=type(exc).__name__))
                    raise
                latency = time.perf_counter() - started
                self._count_call("ok", latency)
                observed.finished(CallResult(
                    latency=latency, message=response.message,
                    stop_reason=response.stop_reason, usage=response.usage,
                    response_id=response.response_id,
                    response_model=response.response_model))
            cost = self.accounting.charge(tenant=conv.key.tenant, provider=self.provider.name,
                                          model=sent.model, usage=response.usage)
            outcome = None
            if persisted.call is not None:
                outcome = Outcome(call=persisted.call, stop_reason=response.stop_reason,
                                  usage=response.usage, latency_ms=latency * 1000,
                                  response_id=response.response_id,
                                  response_model=response.response_model, cost_usd=cost)
            kept = await conv.add_assistant(response.message, outcome)
            text = message_text(response.message["content"]) or ""
            if text:
                texts.append(text)
            uses = _tool_uses(response.message)
            if kept is None:
                # The log refused the answer, so the model will not see it either: its tools
                # are not run (their results would answer a call the conversation lacks).
                return await self._end(conv, sink, "not_recorded", SEPARATOR.join(texts), calls)
            if not uses:
                return await self._end(conv, sink, "answered", SEPARATOR.join(texts), calls)
            results, record = await run_tool_uses(tools, uses, conv.context, self.metrics,
                                                  turn, sink)
            if await conv.add_tool_results(results, record) is None:
                return await self._end(conv, sink, "not_recorded", SEPARATOR.join(texts), calls)
        return await self._end(conv, sink, "iteration_cap", SEPARATOR.join(texts) or CAPPED,
                               calls)

    async def _end(self, conv: Conversation, sink: ReplySink, status: str, text: str,
                   calls: int) -> TurnResult:
        """Deliver the turn's final text (or the apology) once the log holds
        everything the turn recorded, so a gateway restarted after the reply never answers
        the message again; then make it durable (``sync``, after the reply: no fsync delays
        it). ``not_recorded``: the log refused the answer or its tool results, and the turn
        stops with what was said so far."""
        await conv.recorder.flush()
        if status == "apologised" or (status == "not_recorded" and not text):
            text = self.settings.apology
            await sink.fail(text)
        else:
            await sink.finish(text)
        await conv.recorder.sync()
        return TurnResult(status, text, calls)

    def _cache_plan(self, built: BuiltPrompt, tools: ToolSet) -> CachePlan | None:
        """Breakpoints after the tools, the prompt's stable prefix and the history; only the
        Anthropic shape takes them (OpenAI caches prefixes by itself)."""
        if not self.settings.prompt_cache or self.provider.shape != "anthropic":
            return None
        return CachePlan(tools=bool(tools.schemas),
                         system=min(built.stable, len(built.prompt.sections)))

    async def _blobs(self, conv: Conversation,
                     messages: list[dict[str, Any]]) -> dict[str, bytes] | None:
        """The bytes of the attachments these messages refer to, from the blob store; None
        (logged with the missing hashes) when any of them cannot be read."""
        refs = needed(messages)
        if not refs:
            return {}
        found = {} if self.blobs is None else await load(self.blobs, conv.key.tenant, refs)
        missing = [ref.hash for ref in refs if ref.hash not in found]
        if missing:
            log.error("session %s: attachment blob(s) missing from the blob store: %s",
                      conv.session_id, ", ".join(missing))
            return None
        return found

    def _count_call(self, outcome: str, latency: float) -> None:
        labels = {"provider": self.provider.name, "model": self.provider.model,
                  "outcome": outcome}
        self.metrics.provider_calls.labels(**labels).inc()
        self.metrics.provider_latency.labels(**labels).observe(latency)


def _separated(sink: ReplySink, *, first: bool) -> TextSink:
    """The sink's ``delta``, with :data:`SEPARATOR` streamed ahead of this call's text when an
    earlier call of the turn already streamed text (so the stream equals the final reply)."""
    pending = not first

    async def delta(text: str) -> None:
        nonlocal pending
        if pending and text:
            pending = False
            await sink.delta(SEPARATOR)
        await sink.delta(text)

    return delta


def _tool_uses(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]


def _safe(text: str, limit: int = 300) -> str:
    """Error text for the log: bounded (provider messages never carry our keys)."""
    return text[:limit]
