"""Compaction: when the history no longer fits the window, summarise its oldest part.

Before a call whose messages (from the current summary on) would not fit the window budget,
:class:`Compactor` makes one provider call, recorded like any other (reason ``compaction``),
that summarises the oldest messages: the previous summary (injected at position 0) and the
next chunk of the conversation, then an injected instruction. Its answer is recorded in the
call's outcome (``answer``), not as a message: it is not part of the conversation. From then
on every call sends it as injected message 0, in place of the messages it stands for, and its
call entry names the summary's call and the messages it replaced (``summary``, ``replaces``),
so replay rebuilds every body exactly and the viewer shows the lineage.

A chunk ends where a window may start (a plain user message), so tool rounds stay whole; after
compaction the kept messages take at most :attr:`CompactionSettings.keep` of the budget, so
the next compaction is many turns away (and the summary, a stable prefix, stays cached). A
chunk too big for one call is summarised in several. When nothing can be summarised (one
message bigger than the window) or the call fails, the window drops the oldest messages as it
would without compaction, and the turn goes on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gateway.agent.call import Caller, CallSpec
from gateway.agent.conversation import Conversation, Summary
from gateway.agent.window import CHARS_PER_TOKEN, estimate_tokens
from gateway.edge.coordination import LeaseCheck
from gateway.edge.errors import ProviderError
from gateway.edge.observe import TurnHandle
from sessions.records import Injected, Lineage, MessageDict, Prompt, Section, Window
from sessions.scan import message_text

log = logging.getLogger(__name__)

INSTRUCTIONS = """\
You keep the memory of a long conversation between a user and an assistant. You are given the \
conversation so far (it may begin with an earlier summary). Write a summary that lets the \
assistant carry on as if it remembered everything: who the user is, what they asked for, what \
was decided or done (tool results included), open questions, promises, names, numbers and \
preferences. Write plain prose or short bullet points, in the conversation's language, at \
most about 400 words. Do not answer the user; write only the summary."""
PROMPT = Prompt.from_sections([Section("compaction", INSTRUCTIONS)])
ASK = {"role": "user", "content": "Summarise the conversation above, as instructed."}
SUMMARY_HEADER = "[Summary of the earlier part of this conversation]\n"
MAX_ROUNDS = 8
"""Compaction calls before one provider call at most (a long resumed backlog)."""


@dataclass(frozen=True, slots=True)
class CompactionSettings:
    enabled: bool = True
    keep: float = 0.5
    """After compaction the kept messages (and the summary) take at most this share of the
    window budget."""


DEFAULTS = CompactionSettings()


def summary_message(text: str) -> MessageDict:
    """The message a summary is sent as (user role: a window must start with one)."""
    return {"role": "user", "content": SUMMARY_HEADER + text.strip()}


class Compactor:
    """Summarises what no longer fits. Shared by every conversation."""

    def __init__(self, caller: Caller, settings: CompactionSettings | None = None) -> None:
        self.caller = caller
        self.settings = settings or CompactionSettings()

    def overflows(self, conv: Conversation, budget: int) -> bool:
        """Whether the next call's messages (from the summary on) exceed ``budget`` tokens."""
        order = conv.order
        if not order:
            return False
        summary = conv.summary
        floor = summary.floor if summary else 0
        end = order.tail_end(conv.messages)
        if floor >= end:
            return False
        used = order.tokens(floor, end)
        if summary is not None:
            used += estimate_tokens(summary.message)
        return used > budget

    async def fit(self, conv: Conversation, turn: TurnHandle, budget: int, *,
                  lease: LeaseCheck) -> None:
        """Compact until the next call fits ``budget`` (or nothing more can be done)."""
        if not self.settings.enabled:
            return
        for _ in range(MAX_ROUNDS):
            if not self.overflows(conv, budget):
                return
            if not await self._once(conv, turn, budget, lease):
                return
        log.warning("session %s: still over the window after %d compactions", conv.session_id,
                    MAX_ROUNDS)

    async def _once(self, conv: Conversation, turn: TurnHandle, budget: int,
                    lease: LeaseCheck) -> bool:
        """One compaction call; False when there was nothing to summarise or it failed."""
        order, messages = conv.order, conv.messages
        previous = conv.summary
        floor = previous.floor if previous else 0
        end = order.tail_end(messages)
        carried = estimate_tokens(previous.message) if previous else 0
        # The chunk: from the floor to a window start, as big as the kept tail allows, and
        # small enough to be summarised in one call (with the previous summary and the ask).
        keep = int(budget * self.settings.keep) - carried
        room = budget - carried - estimate_tokens(ASK) - len(INSTRUCTIONS) // CHARS_PER_TOKEN
        cut = None
        for position in range(floor + 1, end):
            if not order.plain_user_at(messages, position):
                continue
            if order.tokens(floor, position) > room:
                break
            cut = position
            if order.tokens(position, end) <= keep:
                break
        if cut is None:
            log.warning("session %s: nothing can be summarised to fit the window; the oldest "
                        "messages are left out instead", conv.session_id)
            return False
        chunk = order.ranges(floor, cut)
        sent: list[MessageDict] = []
        injected: list[Injected] = []
        if previous is not None:
            injected.append(Injected(0, previous.message))
            sent.append(previous.message)
        for start, stop in chunk:
            sent.extend(messages[start:stop])
        injected.append(Injected(len(sent), ASK))
        sent.append(ASK)
        replaces = _merged((previous.replaces if previous else ()) + chunk)
        spec = CallSpec(prompt=PROMPT, reason="compaction", tools=(), window=chunk,
                        messages=sent, injected=tuple(injected), cacheable=False,
                        lineage=Lineage(reason="compaction", replaces=replaces))
        try:
            answered = await self.caller.call(conv, turn, spec, lease=lease)
        except ProviderError as exc:
            log.warning("session %s: compaction failed (%s); the oldest messages are left out "
                        "instead", conv.session_id, exc.kind)
            return False
        text = message_text(answered.response.message.get("content")) or ""
        outcome = answered.outcome(answer=answered.response.message)
        if outcome is not None:
            await conv.add_outcome(outcome)
        if not text.strip():
            log.warning("session %s: compaction gave an empty summary", conv.session_id)
            return False
        conv.summary = Summary(answered.call, summary_message(text), replaces, cut)
        log.info("session %s: compacted %d message(s) into a summary", conv.session_id,
                 sum(b - a for a, b in chunk))
        return True


def _merged(ranges: Window) -> Window:
    """Ranges in order with touching ones joined: [(0, 4), (4, 9)] -> [(0, 9)]."""
    out: list[tuple[int, int]] = []
    for start, end in ranges:
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return tuple(out)
