"""One live conversation: its session's recorder and its messages in memory.

Messages are kept in *log order* (their index in the session log, which call windows refer
to) and, separately, in *conversation order*. The two differ when a message arrives while a
turn is running: it is recorded on receipt (so nothing acknowledged is lost), but it joins the
conversation only when its own turn starts, after the running turn's tool round and answer.
Windows are lists of index ranges, so they express that order exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from gateway.messages import ChannelContext, ConversationKey
from gateway.recorder import SessionRecorder
from gateway.window import ConversationOrder, estimate_tokens, has_tool_use, is_plain_user
from sessions import entries
from sessions.records import MessageDict, Outcome


class Conversation:
    """State of one conversation's current session. Owned by the router; one turn at a time."""

    def __init__(
        self,
        key: ConversationKey,
        recorder: SessionRecorder,
        context: ChannelContext,
        messages: list[MessageDict] | None = None,
    ) -> None:
        self.key = key
        self.recorder = recorder
        self.context = context
        self.messages: list[MessageDict] = messages or []
        self.costs = [estimate_tokens(m) for m in self.messages]
        self.order = ConversationOrder()
        for index in conversation_order(self.messages):
            self.order.append(index, self.costs[index])
        self.last_prompt: str | None = recorder.writer.state.last_prompt
        self.last_active = 0.0
        """Wall-clock time of the last inbound message (for idle rotation)."""
        self.clock: Callable[[], float] = time.time

    @property
    def session_id(self) -> str:
        return self.recorder.session_id

    async def receive(self, message: MessageDict, meta: Mapping[str, Any] | None = None) -> int:
        """Record an inbound user message now; it joins the conversation at :meth:`begin`."""
        index = self._add(message)
        self.last_active = self.clock()
        await self.recorder.append([entries.message(message, meta)])
        return index

    def begin(self, index: int, context: ChannelContext | None = None) -> None:
        """Start the turn of the inbound message recorded at ``index``."""
        self.order.append(index, self.costs[index])
        if context is not None and context != self.context:
            self.context = context

    async def add_assistant(self, message: MessageDict, outcome: Outcome | None) -> int:
        """Record the provider's answer (and the call's outcome) in one append."""
        index = self._add(message)
        self.order.append(index, self.costs[index])
        batch = [entries.message(message)]
        if outcome is not None:
            batch.append(entries.outcome(outcome))
        await self.recorder.append(batch)
        return index

    async def add_tool_results(self, message: MessageDict) -> int:
        index = self._add(message)
        self.order.append(index, self.costs[index])
        await self.recorder.append([entries.message(message)])
        return index

    async def add_outcome(self, outcome: Outcome) -> None:
        await self.recorder.append([entries.outcome(outcome)])

    def _add(self, message: MessageDict) -> int:
        self.messages.append(message)
        self.costs.append(estimate_tokens(message))
        return len(self.messages) - 1


def conversation_order(messages: list[MessageDict]) -> list[int]:
    """Conversation order of a resumed log: user messages recorded in the middle of another
    turn's tool round are moved after that turn's answer."""
    order: list[int] = []
    deferred: list[int] = []
    open_round = False
    for index, message in enumerate(messages):
        if message["role"] == "assistant":
            order.append(index)
            open_round = has_tool_use(message)
            if not open_round:
                order.extend(deferred)
                deferred.clear()
        elif open_round and is_plain_user(message):
            deferred.append(index)
        else:
            order.append(index)  # tool results belong to the open round
    order.extend(deferred)
    return order
