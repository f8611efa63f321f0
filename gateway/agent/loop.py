"""The agent loop: one turn = provider calls and tool runs until a final answer.

Words used everywhere: a **turn** answers one inbound message; a **call** is one provider
request (a turn with a tool round makes two or more calls). Per iteration: refresh the
system prompt (cheap when unchanged), choose the message window, make the call (recorded
before it is sent, then the lease check of the claim the turn serves:
:mod:`gateway.agent.call`), record the answer, run the tools it asked for, record their
results. The loop knows nothing about
platforms or files: channel sink, store (through the conversation's recorder), provider, prompt
source and tools are all injected. What tracers see goes through the observer seam
(:mod:`gateway.edge.observe`); the log context (:mod:`gateway.edge.logctx`) names the tenant,
channel,
conversation and session for the whole turn and the call number during each call, with the
``trace_id`` and ``span_id`` its trace has (:mod:`sessions.traces`).

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

from gateway.agent.call import BeforeCallHook, Caller, CallSpec
from gateway.agent.compaction import DEFAULTS as DEFAULT_COMPACTION
from gateway.agent.compaction import PROMPT as COMPACTION_PROMPT
from gateway.agent.compaction import CompactionSettings, Compactor
from gateway.agent.conversation import Conversation
from gateway.agent.prompt import BuiltPrompt, PromptSource
from gateway.agent.recorder import CallRecorder
from gateway.agent.tools import ToolRegistry, ToolSet, run_tool_uses
from gateway.agent.window import estimate_tokens
from gateway.edge import logctx
from gateway.edge.channel import ReplySink
from gateway.edge.coordination import LeaseCheck
from gateway.edge.errors import Failure, NotRecordedError, ProviderError
from gateway.edge.metrics import Metrics, tenant_label
from gateway.edge.observe import (
    NO_OBSERVER,
    TurnHandle,
    TurnInfo,
    TurnObserver,
)
from gateway.edge.provider import Provider, TextSink
from gateway.usage.accounting import Accounting
from gateway.usage.limits import Limits, Refusal, iso_time
from sessions import entries, traces
from sessions.attachments import needed
from sessions.blobs import BlobStore, load
from sessions.errors import BlobCorruptError
from sessions.records import NO_LINEAGE, Injected, Lineage, window_messages
from sessions.scan import message_text

log = logging.getLogger(__name__)

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
    compaction: CompactionSettings = DEFAULT_COMPACTION
    """When the history no longer fits, summarise its oldest part
    (:mod:`gateway.agent.compaction`)."""


@dataclass(frozen=True, slots=True)
class TurnResult:
    """How a turn ended: ``answered``, ``apologised``, ``iteration_cap``, ``refused`` (a
    budget or rate limit: :mod:`gateway.usage.limits`) or ``not_recorded``
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
        recorder: CallRecorder,
        metrics: Metrics,
        hooks: Sequence[BeforeCallHook] = (),
        settings: LoopSettings | None = None,
        observer: TurnObserver = NO_OBSERVER,
        accounting: Accounting | None = None,
        blobs: BlobStore | None = None,
        fallbacks: Sequence[Provider] = (),
        limits: Limits | None = None,
    ) -> None:
        self.provider = provider
        self.prompts = prompts
        self.tools = tools
        self.metrics = metrics
        self.settings = settings or LoopSettings()
        self.observer = observer
        self.blobs = blobs
        """Where attachment bytes are read from at send time (None: no attachments)."""
        self.caller = Caller([provider, *fallbacks], recorder, metrics,
                             accounting or Accounting(metrics), hooks=hooks,
                             prompt_cache=self.settings.prompt_cache)
        """Makes the recorded calls: ``provider`` first, then each of ``fallbacks``; each is
        recorded by ``recorder`` first, then ``hooks`` run in order."""
        self.compactor = Compactor(self.caller, self.settings.compaction)
        self.limits = limits
        """Budgets and rate limits, checked before a turn's first call (None: no limits)."""

    async def run_turn(self, conv: Conversation, inbound_index: int, sink: ReplySink, *,
                       lease: LeaseCheck) -> TurnResult:
        """Answer the inbound message recorded at ``inbound_index`` (already in the log).

        ``lease`` is the check of the claim the turn serves, run before each provider call
        (its :class:`~gateway.edge.coordination.LeaseLostError` propagates).

        Raises :class:`~gateway.edge.errors.NotRecordedError` (``fenced``) when the session's
        writer was fenced off (another worker owns the conversation now): before any provider
        call, or instead of delivering an answer the log refused (the new holder runs the turn
        again, and its answer is the one delivered and recorded).
        """
        key = conv.key
        info = TurnInfo(tenant=key.tenant, channel=key.channel, conversation=key.label(),
                        session=conv.session_id, inbound=inbound_index)
        with logctx.bound(tenant=info.tenant, channel=info.channel,
                          conversation=info.conversation, session=info.session,
                          trace_id=traces.trace_id(key.tenant, conv.session_id, inbound_index),
                          span_id=traces.turn_span_id(key.tenant, conv.session_id,
                                                      inbound_index)):
            turn = self.observer.turn_started(info)
            started = time.perf_counter()
            status = "error"
            try:
                result = await self._run(conv, inbound_index, sink, turn, lease)
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
                   turn: TurnHandle, lease: LeaseCheck) -> TurnResult:
        conv.begin(inbound_index)
        if self.limits is not None:
            refusal = await self.limits.check(conv.key, conv.context, conv.clock())
            if refusal is not None:
                return await self._refuse(conv, sink, refusal, inbound_index)
        await sink.typing()
        texts: list[str] = []
        calls = 0
        for _ in range(self.settings.max_iterations):
            calls += 1
            built = await self.prompts.build(conv.context)
            tools = self.tools.for_tenant(conv.key.tenant)
            spec = await self._spec(conv, turn, built, tools, lease)
            if spec is None:  # never send (or record) a call whose attachments are gone
                return await self._end(conv, sink, "apologised", "", calls, inbound_index)
            try:
                answered = await self.caller.call(conv, turn, spec,
                                                  on_text=_separated(sink, first=not texts),
                                                  lease=lease)
            except ProviderError:
                return await self._end(conv, sink, "apologised", "", calls, inbound_index)
            response = answered.response
            outcome = answered.outcome()
            kept = await conv.add_assistant(response.message, outcome)
            text = message_text(response.message["content"]) or ""
            if text:
                texts.append(text)
            uses = _tool_uses(response.message)
            if kept is None:
                # The log refused the answer, so the model will not see it either: its tools
                # are not run (their results would answer a call the conversation lacks).
                return await self._end(conv, sink, "not_recorded", SEPARATOR.join(texts), calls,
                                       inbound_index)
            if not uses:
                return await self._end(conv, sink, "answered", SEPARATOR.join(texts), calls,
                                       inbound_index)
            results, record = await run_tool_uses(tools, uses, conv.context, self.metrics,
                                                  turn, sink)
            if await conv.add_tool_results(results, record) is None:
                return await self._end(conv, sink, "not_recorded", SEPARATOR.join(texts), calls,
                                       inbound_index)
        return await self._end(conv, sink, "iteration_cap", SEPARATOR.join(texts) or CAPPED,
                               calls, inbound_index)

    async def _refuse(self, conv: Conversation, sink: ReplySink,
                      refusal: Refusal, inbound_index: int) -> TurnResult:
        """Answer a turn over a budget or rate limit with its one sentence: nothing reaches
        the provider; the refusal is recorded (with the sentence, naming the message it
        answers, so a restart sends it no more) and counted."""
        log.info("turn refused: %s until %s", refusal.limit, iso_time(refusal.until))
        self.metrics.limited.labels(tenant=tenant_label(conv.key.tenant, conv.key.channel),
                                    limit=refusal.limit).inc()
        await conv.recorder.append([entries.refusal(
            refusal.limit, iso_time(refusal.until), message=inbound_index, text=refusal.text)])
        return await self._end(conv, sink, "refused", refusal.text, 0, inbound_index)

    async def _end(self, conv: Conversation, sink: ReplySink, status: str, text: str,
                   calls: int, inbound_index: int) -> TurnResult:
        """Deliver the turn's final text (or the apology) once the log holds everything the
        turn recorded, so a gateway restarted after the reply never answers the message again;
        make it durable (``sync``) while the reply is sent, so no fsync delays the reply, nor
        the conversation's next message (the turn ends once the reply is out; the fsync runs
        on, and the writer's close waits for it).
        ``not_recorded``: the log refused the answer or its tool results, and the turn stops
        with what was said so far. An apology is recorded (a ``reply`` entry naming the
        message) before it goes out, as an answer is."""
        apology = status == "apologised" or (status == "not_recorded" and not text)
        if apology:
            await conv.recorder.append([entries.reply(inbound_index, "apology",
                                                      self.settings.apology)])
        if (await conv.recorder.flush()).failure == Failure.FENCED:
            # The answer was accepted but another worker took the session before it was
            # written: that worker answers (see Conversation.add_assistant).
            raise NotRecordedError(conv.session_id, Failure.FENCED)
        # The fsync starts now, in its thread, and runs while the reply is sent. Nothing waits
        # for it any more: a killed process loses nothing (the entries are in the file, just
        # above), and what a power loss can cost is what it could before, when the turn
        # waited (the fsync begins at the same moment; the conversation's next message no
        # longer queues behind it).
        durable = conv.recorder.sync_soon()
        try:
            if apology:
                text = self.settings.apology
                await sink.fail(text)
            else:
                await sink.finish(text)
        except BaseException:
            # A turn cancelled mid-send stops waiting (the writer still finishes an fsync it
            # began; its close waits for it).
            durable.cancel()
            raise
        return TurnResult(status, text, calls)

    async def _spec(self, conv: Conversation, turn: TurnHandle, built: BuiltPrompt,
                    tools: ToolSet, lease: LeaseCheck) -> CallSpec | None:
        """The next call: compact first if the history no longer fits, then the window (after
        the summary, which goes first); None when an attachment's bytes are gone."""
        prompt = built.prompt
        # The reason is written only with a prompt the log has not seen yet (persist_call
        # compares with the log's last prompt, the one owner of "last prompt").
        last = conv.recorder.last_prompt
        if last is None:
            reason = "initial"
        elif last == COMPACTION_PROMPT.fingerprint:
            reason = "after:compaction"
        else:
            reason = f"rebuilt:{built.cause}"
        budget = self.settings.window_tokens
        await self.compactor.fit(conv, turn, budget, lease=lease)
        summary = conv.summary
        lineage = NO_LINEAGE
        if summary is None:
            window = conv.order.choose(conv.messages, budget)
            injected: tuple[Injected, ...] = ()
        else:
            window = conv.order.choose(conv.messages, budget - estimate_tokens(summary.message),
                                       summary.floor)
            injected = summary.injected
            lineage = Lineage(summary=summary.call, replaces=summary.replaces)
        messages = window_messages(conv.messages, window, injected)
        blobs = await self._blobs(conv, messages)
        if blobs is None:
            return None
        return CallSpec(prompt=prompt, reason=reason, tools=tools.schemas, window=window,
                        messages=messages, injected=injected, blobs=blobs, stable=built.stable,
                        lineage=lineage)

    async def _blobs(self, conv: Conversation,
                     messages: list[dict[str, Any]]) -> dict[str, bytes] | None:
        """The bytes of the attachments these messages refer to, from the blob store; None
        (logged with the missing or damaged hashes) when any of them cannot be read."""
        refs = needed(messages)
        if not refs:
            return {}
        try:
            found = {} if self.blobs is None else await load(self.blobs, conv.key.tenant, refs)
        except BlobCorruptError as exc:
            log.error("session %s: %s", conv.session_id, exc)
            return None
        missing = [ref.hash for ref in refs if ref.hash not in found]
        if missing:
            log.error("session %s: attachment blob(s) missing from the blob store: %s",
                      conv.session_id, ", ".join(missing))
            return None
        return found


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
