"""One live conversation: its session's recorder and its messages in memory.

Messages are kept in *log order* (their index in the session log, which call windows refer
to) and, separately, in *conversation order*. The two differ when a message arrives while a
turn is running: it is recorded on receipt (so nothing acknowledged is lost), but it joins the
conversation only when its own turn starts, after the running turn's tool round and answer.
Windows are lists of index ranges, so they express that order exactly.

Memory never runs ahead of the log: a message joins ``messages`` only once the session's writer
has accepted it (written, or kept to be written ahead of the next append), so every window
indexes what the log holds. A refused message is left out (the recorder notes the gap in the
log) and the caller is told: :meth:`receive` raises, the ``add_*`` methods return ``None``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.agent.recorder import SessionRecorder, Written
from gateway.agent.window import ConversationOrder, estimate_tokens, has_tool_use, is_plain_user
from gateway.edge.errors import Failure, NotRecordedError
from gateway.edge.messages import ChannelContext, ConversationKey
from sessions import entries
from sessions.records import Injected, MessageDict, Outcome, Window


@dataclass(frozen=True, slots=True)
class Summary:
    """A compaction summary: sent as injected message 0 of every call, in place of the oldest
    messages (:mod:`gateway.agent.compaction`)."""

    call: int | None
    """The compaction call that wrote it (None when that call's entry was not recorded)."""
    message: MessageDict
    replaces: Window
    """Log-index ranges of the messages it stands for."""
    floor: int
    """How many leading positions of the conversation order it covers."""

    @property
    def injected(self) -> tuple[Injected, ...]:
        return (Injected(0, self.message),)


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
        self.tokens = sum(self.costs)
        """Estimated tokens of every message in memory (what :attr:`approx_bytes` weighs)."""
        self.order = ConversationOrder()
        for index in conversation_order(self.messages):
            self.order.append(index, self.costs[index])
        self.summary: Summary | None = None
        """The compaction summary calls send instead of the oldest messages, if any."""
        self.last_active = 0.0
        """Wall-clock time of the last inbound message (for idle rotation)."""
        self.clock: Callable[[], float] = time.time
        self.inbound: int | None = None
        """The index of the message whose turn runs (or ran last): recorded with each call
        of that turn, and what its trace is derived from (:mod:`sessions.traces`)."""

    @property
    def session_id(self) -> str:
        return self.recorder.session_id

    @property
    def approx_bytes(self) -> int:
        """What the conversation holds in memory, about: measured with tracemalloc over
        conversations of 0-400 messages of 10-1,000 characters loaded from their logs (within
        a few per cent): 3 KB, about 480 bytes a message, and 4 a token of text (ASCII)."""
        return 3000 + 480 * len(self.messages) + 4 * self.tokens

    def restore_summary(self, call: int | None, message: MessageDict, replaces: Window) -> None:
        """Take up a summary found in the log (a resumed session): it covers the leading
        positions of the conversation order whose messages are in ``replaces``."""
        covered = {i for start, end in replaces for i in range(start, end)}
        floor = 0
        while floor < len(self.order.order) and self.order.order[floor] in covered:
            floor += 1
        if floor:
            self.summary = Summary(call, message, replaces, floor)

    async def receive(self, message: MessageDict, meta: Mapping[str, Any] | None = None) -> int:
        """Record an inbound user message now; it joins the conversation at :meth:`begin`.

        Raises :class:`~gateway.edge.errors.NotRecordedError` when the log refuses it (then it is
        not part of the conversation, and must not be acknowledged).
        """
        self.last_active = self.clock()
        index, written = await self._record(message, [entries.message(message, meta)])
        if index is None:
            raise NotRecordedError(self.session_id, written.failure or Failure.UNKNOWN)
        # In the log (not only accepted) before the caller acknowledges it.
        await self.recorder.flush()
        return index

    def begin(self, index: int, context: ChannelContext | None = None) -> None:
        """Start the turn of the inbound message recorded at ``index`` (already part of the
        conversation when its turn is finished after a takeover: then it stays where it is)."""
        self.inbound = index
        if index not in self.order:
            self.order.append(index, self.costs[index])
        if context is not None and context != self.context:
            self.context = context

    async def add_assistant(self, message: MessageDict, outcome: Outcome | None) -> int | None:
        """Record the provider's answer (and the call's outcome) in one append; its index, or
        ``None`` when the log refused it (then it is not in the conversation). Raises
        :class:`~gateway.edge.errors.NotRecordedError` (``fenced``) when another worker owns the
        session now."""
        batch = [entries.message(message)]
        if outcome is not None:
            batch.append(entries.outcome(outcome))
        index, written = await self._record(message, batch)
        _not_fenced(self.session_id, written)
        if index is not None:
            self.order.append(index, self.costs[index])
        return index

    async def add_tool_results(self, message: MessageDict,
                               meta: Mapping[str, Any] | None = None) -> int | None:
        """Record a tool round's results (``meta`` says how each call went; never sent); its
        index, or ``None`` when the log refused it. Raises like :meth:`add_assistant`."""
        index, written = await self._record(message, [entries.message(message, meta)])
        _not_fenced(self.session_id, written)
        if index is not None:
            self.order.append(index, self.costs[index])
        return index

    async def add_outcome(self, outcome: Outcome) -> bool:
        """Record a call's outcome on its own (a failed call); False when refused."""
        return (await self.recorder.append([entries.outcome(outcome)])).accepted

    async def _record(self, message: MessageDict,
                      batch: list[dict[str, Any]]) -> tuple[int | None, Written]:
        # The slot is taken before the append: writers accept in call order (SessionWriter
        # contract), so the message's index in memory is its index in the log. A refusal is
        # decided before the writer's first suspension, so the slot is still the last one.
        index = len(self.messages)
        self.messages.append(message)
        self.costs.append(estimate_tokens(message))
        self.tokens += self.costs[-1]
        written = await self.recorder.append(batch)
        if written.accepted:
            return index, written
        if index != len(self.messages) - 1:  # pragma: no cover - a writer broke the contract
            raise AssertionError("a refused append was not the last one")
        self.messages.pop()
        self.tokens -= self.costs.pop()
        return None, written


def _not_fenced(session_id: str, written: Written) -> None:
    """Raise when a write was refused because another worker owns the session now.

    That worker answers the message: its turn is recorded without an answer, so the new holder
    runs it again. Delivering this worker's answer as well would answer the message twice, or,
    once the item counts as answered, leave the answer the person got out of the log (the
    several-worker outage trials found both when Redis lost its leases mid-turn).
    """
    if not written.accepted and written.failure == Failure.FENCED:
        raise NotRecordedError(session_id, Failure.FENCED)


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
