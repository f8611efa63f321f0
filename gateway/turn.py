"""The agent loop: one turn = provider calls and tool runs until a final answer.

Per iteration: refresh the system prompt (cheap when unchanged), choose the message window,
run the before-call hooks (the prompt-persist hook among them), call the provider, record the
answer, run the tools it asked for, record their results. The loop knows nothing about
platforms or files: channel sink, store (through the conversation's recorder), provider, prompt
source and tools are all injected.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.channel import ReplySink
from gateway.conversation import Conversation
from gateway.errors import ProviderError
from gateway.hooks import BeforeCallHook, CallContext, run_hooks
from gateway.metrics import Metrics
from gateway.prompt import PromptSource
from gateway.providers.base import Provider, ProviderRequest
from gateway.tools import ToolRegistry
from sessions.records import CallRequest, Outcome, window_messages
from sessions.scan import message_text

log = logging.getLogger("gateway.turn")

APOLOGY = "Sorry, I couldn't reach my language model just now. Please try again in a moment."
CAPPED = "I stopped after too many steps without a final answer."
"""The answer of a turn stopped at the iteration cap without any text."""


@dataclass(frozen=True, slots=True)
class LoopSettings:
    max_iterations: int = 8
    window_tokens: int = 16_000
    apology: str = APOLOGY


@dataclass(frozen=True, slots=True)
class TurnResult:
    """How a turn ended: ``answered``, ``apologised`` or ``iteration_cap``."""

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
    ) -> None:
        self.provider = provider
        self.prompts = prompts
        self.tools = tools
        self.hooks = tuple(hooks)
        self.metrics = metrics
        self.settings = settings or LoopSettings()

    async def run_turn(self, conv: Conversation, inbound_index: int, sink: ReplySink) -> TurnResult:
        """Answer the inbound message recorded at ``inbound_index`` (already in the log)."""
        conv.begin(inbound_index)
        await sink.typing()
        texts: list[str] = []
        calls = 0
        for _ in range(self.settings.max_iterations):
            calls += 1
            built = await self.prompts.build(conv.context)
            prompt = built.prompt
            if conv.last_prompt is None:
                reason = "initial"
            elif prompt.fingerprint != conv.last_prompt:
                reason = f"rebuilt:{built.cause}"
            else:
                reason = "unchanged"  # not written: the log keeps the entry that introduced it
            window = conv.order.choose(conv.messages, self.settings.window_tokens)
            params = dict(self.provider.params())
            request = CallRequest(
                prompt=prompt, reason=reason, tools=self.tools.schemas,
                provider=self.provider.name, model=self.provider.model, params=params,
                window=window,
            )
            state = conv.recorder.writer.state
            call_index = state.call_count
            await run_hooks(self.hooks, CallContext(conv.recorder, request))
            recorded = state.call_count == call_index + 1
            conv.last_prompt = prompt.fingerprint
            started = time.perf_counter()
            try:
                response = await self.provider.complete(
                    ProviderRequest(
                        system=prompt.text,
                        messages=window_messages(conv.messages, window),
                        tools=self.tools.schemas,
                        model=self.provider.model,
                        params=params,
                    ),
                    on_text=sink.delta,
                )
            except ProviderError as exc:
                latency = time.perf_counter() - started
                self._count_call("error", latency)
                log.warning("session %s: provider call failed (%s)", conv.session_id, exc.kind)
                if recorded:
                    await conv.add_outcome(Outcome(
                        call=call_index, latency_ms=latency * 1000,
                        error={"kind": exc.kind, "message": _safe(str(exc))},
                    ))
                await sink.fail(self.settings.apology)
                await conv.recorder.sync()
                return TurnResult("apologised", self.settings.apology, calls)
            latency = time.perf_counter() - started
            self._count_call("ok", latency)
            outcome = Outcome(call=call_index, stop_reason=response.stop_reason,
                              usage=response.usage, latency_ms=latency * 1000) if recorded else None
            await conv.add_assistant(response.message, outcome)
            text = message_text(response.message["content"]) or ""
            if text:
                texts.append(text)
            uses = _tool_uses(response.message)
            if not uses:
                final = "\n\n".join(texts)
                await sink.finish(final)
                await conv.recorder.sync()
                return TurnResult("answered", final, calls)
            results = []
            for use in uses:
                result = await self.tools.run(use["name"], use.get("input") or {}, conv.context)
                block: dict[str, Any] = {"type": "tool_result", "tool_use_id": use["id"],
                                         "content": result.text}
                if result.is_error:
                    block["is_error"] = True
                results.append(block)
            await conv.add_tool_results({"role": "user", "content": results})
        final = "\n\n".join(texts) or CAPPED
        await sink.finish(final)
        await conv.recorder.sync()
        return TurnResult("iteration_cap", final, calls)

    def _count_call(self, outcome: str, latency: float) -> None:
        self.metrics.provider_calls.labels(provider=self.provider.name, outcome=outcome).inc()
        self.metrics.provider_latency.labels(provider=self.provider.name).observe(latency)


def _tool_uses(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]


def _safe(text: str, limit: int = 300) -> str:
    """Error text for the log: bounded (provider messages never carry our keys)."""
    return text[:limit]
