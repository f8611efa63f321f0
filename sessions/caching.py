"""Prompt-cache breakpoints: where a call asks the provider to cache its prompt prefix. Pure.

Anthropic caches a request's prefix (tools, then system, then messages) up to each block that
carries ``cache_control``; a later request that starts with the same bytes reads that prefix
from the cache at a tenth of the input price. Which blocks carry the marker is decided per call
by a :class:`CachePlan`, recorded in the call entry (``"cache"``), and applied to the body by
:func:`add_breakpoints` as a separate step after the body is shaped. So the markers are part of
the recorded body, and replay, which applies the same plan with the same function, rebuilds
them exactly.

A plan places at most three of the API's four breakpoints:

``tools``
    on the last tool schema: the tool set alone (it rarely changes);
``system``
    after the first ``system`` sections of the prompt, the stable prefix (the operator's
    layer). The system prompt is then sent as two text blocks: those sections joined with
    :data:`~sessions.records.PROMPT_JOINER` and ending with one more joiner, then the rest
    joined (:func:`system_blocks`). The blocks' texts join to the system prompt byte for byte,
    so the model reads exactly the prompt replay shows. (Plans recorded before ``joined``
    left that last joiner out: the model read the two sections glued together. Replay
    rebuilds such calls as they were sent and shows the text the model read:
    :func:`sent_system`.)
``history``
    on the last block of the last message sent, so the next call of the conversation, which
    repeats all of it, reads it from the cache.

OpenAI caches prompt prefixes by itself and takes no markers; its shape ignores the plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sessions.records import PROMPT_JOINER, CachePlan

__all__ = ["EPHEMERAL", "MAX_BREAKPOINTS", "CachePlan", "add_breakpoints", "glued_at",
           "sent_system", "system_blocks"]

MAX_BREAKPOINTS = 4
"""The Messages API refuses a request with more blocks marked ``cache_control`` than this."""

EPHEMERAL: Mapping[str, str] = {"type": "ephemeral"}
_UNMARKABLE = frozenset({"thinking", "redacted_thinking"})


def system_blocks(plan: CachePlan, sections: Sequence[str]) -> tuple[str, ...]:
    """The texts of the ``system`` blocks ``plan`` cuts the prompt into (``plan.system`` > 0):
    the stable sections, then the rest when there is any. For a plan with ``joined`` their
    concatenation is ``PROMPT_JOINER.join(sections)``: the joiner between the two parts ends
    the stable block (it is part of the cached prefix, the same for every call that has a
    rest)."""
    stable = PROMPT_JOINER.join(sections[: plan.system])
    rest = PROMPT_JOINER.join(sections[plan.system :])
    if not rest:
        return (stable,)
    return (stable + PROMPT_JOINER, rest) if plan.joined else (stable, rest)


def glued_at(plan: CachePlan | None, sections: Sequence[str]) -> int | None:
    """When ``plan`` is one of the old ones that left the joiner out between the system blocks
    (and there were two), the index of the first section after the cut; else None."""
    if plan is None or plan.joined or not 0 < plan.system < len(sections):
        return None
    if not PROMPT_JOINER.join(sections[plan.system :]):
        return None
    return plan.system


def sent_system(plan: CachePlan | None, sections: Sequence[str], text: str) -> str:
    """The system prompt an Anthropic-shaped request with ``plan`` carried: the join of its
    blocks' texts. That is ``text`` (the recorded prompt, the join of ``sections``), except for
    the old plans :func:`glued_at` finds, whose blocks left one joiner out."""
    if glued_at(plan, sections) is None:
        return text
    assert plan is not None
    return "".join(system_blocks(plan, sections))


def add_breakpoints(
    body: dict[str, Any], plan: CachePlan, sections: Sequence[str]
) -> dict[str, Any]:
    """``body`` (an Anthropic Messages body) with the plan's ``cache_control`` markers.

    ``sections`` are the texts of the prompt's sections, in order; their join is the body's
    ``system``. Only the containers that change are copied: the caller's messages and tool
    schemas are never modified. Raises ValueError when ``sections`` do not make up the system
    prompt the body carries (the plan would then cut it somewhere else than recorded).
    """
    out = dict(body)
    if plan.tools and out.get("tools"):
        tools = list(out["tools"])
        tools[-1] = {**tools[-1], "cache_control": dict(EPHEMERAL)}
        out["tools"] = tools
    system = out.get("system")
    if plan.system and isinstance(system, str):
        if PROMPT_JOINER.join(sections) != system:
            raise ValueError("the prompt sections do not make up the system prompt")
        texts = system_blocks(plan, sections)
        blocks: list[dict[str, Any]] = [
            {"type": "text", "text": texts[0], "cache_control": dict(EPHEMERAL)}
        ]
        blocks.extend({"type": "text", "text": text} for text in texts[1:])
        out["system"] = blocks
    messages = out.get("messages")
    if plan.history and messages:
        messages = list(messages)
        last = dict(messages[-1])
        content = last["content"]
        if isinstance(content, str):
            # An empty text block is refused by the API; an empty message gets no marker.
            content = [{"type": "text", "text": content}] if content else []
        else:
            content = list(content)
        # Thinking blocks cannot carry a marker themselves; the block after them can.
        marked = [i for i, b in enumerate(content) if b.get("type") not in _UNMARKABLE]
        if marked:
            content[marked[-1]] = {**content[marked[-1]], "cache_control": dict(EPHEMERAL)}
            last["content"] = content
            messages[-1] = last
            out["messages"] = messages
    return out
