"""What a provider call is made of, as the agent loop hands it to the store.

These are the *request parts*; :mod:`sessions.shapes` turns them into a provider's request body
and :mod:`sessions.persist` writes them to the log. Both live and replayed requests go through
the same shaping code, which is what makes "what the provider received" and "what replay
rebuilds" equal by construction rather than by hope.

Messages stay plain JSON-shaped dicts (``{"role": ..., "content": ...}``, content a string or a
list of Anthropic-style blocks) because they are sent and stored verbatim; copying them into
objects and back would only create room for the two to differ.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from sessions.fingerprint import fingerprint

MessageDict: TypeAlias = dict[str, Any]
ToolSchema: TypeAlias = Mapping[str, Any]
Window: TypeAlias = tuple[tuple[int, int], ...]
"""Half-open ranges ``[start, end)`` of message indices (0-based, counting message entries)."""

PROMPT_JOINER = "\n\n"
"""Sections are joined with this string to form the final system prompt."""


@dataclass(frozen=True, slots=True)
class Section:
    """One named part of the system prompt (soul, user, memory, skills, mood, kb, channel...)."""

    name: str
    text: str


@dataclass(frozen=True, slots=True)
class Injected:
    """A message sent to the provider that is not a message entry (a compaction summary, say).

    ``position`` is its index in the final list of messages sent.
    """

    position: int
    message: MessageDict


@dataclass(frozen=True, slots=True)
class Prompt:
    """An assembled system prompt: ordered sections, the final text and its fingerprint."""

    sections: tuple[Section, ...]
    text: str
    fingerprint: str

    @property
    def texts(self) -> tuple[str, ...]:
        """The sections' texts, in order (their join is :attr:`text`)."""
        return tuple(s.text for s in self.sections)

    @classmethod
    def from_sections(cls, sections: Sequence[Section]) -> Prompt:
        kept = tuple(s for s in sections if s.text)
        text = PROMPT_JOINER.join(s.text for s in kept)
        return cls(sections=kept, text=text, fingerprint=fingerprint(text))


@dataclass(frozen=True, slots=True)
class CachePlan:
    """Where one call's prompt-cache breakpoints go (:mod:`sessions.caching` places them)."""

    tools: bool = True
    system: int = 0
    """How many leading prompt sections form the stable prefix (0: no system breakpoint)."""
    history: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"tools": self.tools, "system": self.system, "history": self.history}

    @classmethod
    def from_json(cls, value: Any) -> CachePlan | None:
        """The plan recorded in a call entry; None when absent or not a plan."""
        if not isinstance(value, Mapping):
            return None
        tools, system, history = value.get("tools"), value.get("system"), value.get("history")
        if not (isinstance(tools, bool) and isinstance(history, bool)):
            return None
        if not isinstance(system, int) or isinstance(system, bool) or system < 0:
            return None
        return cls(tools=tools, system=system, history=history)


@dataclass(frozen=True, slots=True)
class CallRequest:
    """Everything a provider is about to receive for one call, in provider-neutral form."""

    prompt: Prompt
    reason: str
    tools: tuple[ToolSchema, ...]
    provider: str
    model: str
    params: Mapping[str, Any]
    window: Window
    injected: tuple[Injected, ...] = ()
    cache: CachePlan | None = None
    """Prompt-cache breakpoints placed in the body (Anthropic shape), if any."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What came back from one call: written after it as an ``outcome`` entry."""

    call: int
    stop_reason: str | None = None
    usage: Mapping[str, int] = field(default_factory=dict)
    latency_ms: float | None = None
    error: Mapping[str, str] | None = None
    response_id: str | None = None
    """The provider's id of its answer (``msg_...``, ``chatcmpl-...``), when it sent one."""
    response_model: str | None = None
    """The model version that answered, as the provider named it."""
    cost_usd: float | None = None
    """What the call cost by the price table in force when it was made (unknown model: None)."""


def window_messages(
    messages: Sequence[MessageDict], window: Window, injected: Sequence[Injected] = ()
) -> list[MessageDict]:
    """The list of messages a window selects, with injected messages put at their positions."""
    sent: list[MessageDict] = []
    for start, end in window:
        sent.extend(messages[start:end])
    for item in sorted(injected, key=lambda i: i.position):
        sent.insert(item.position, item.message)
    return sent
