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
    joined: bool = True
    """The system blocks keep :data:`PROMPT_JOINER` (the stable block ends with it), so their
    texts join to the system prompt byte for byte. False only for plans read from logs written
    before (no ``joined`` key): those calls were sent with the joiner between the two blocks
    left out, and replay rebuilds them as they were sent."""

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"tools": self.tools, "system": self.system,
                                "history": self.history}
        if self.joined:
            body["joined"] = True
        return body

    @classmethod
    def from_json(cls, value: Any) -> CachePlan | None:
        """The plan recorded in a call entry; None when absent or not a plan."""
        if not isinstance(value, Mapping):
            return None
        tools, system, history = value.get("tools"), value.get("system"), value.get("history")
        joined = value.get("joined", False)
        if not (isinstance(tools, bool) and isinstance(history, bool) and isinstance(joined, bool)):
            return None
        if not isinstance(system, int) or isinstance(system, bool) or system < 0:
            return None
        return cls(tools=tools, system=system, history=history, joined=joined)


@dataclass(frozen=True, slots=True)
class Lineage:
    """Why a call was made, when it is not a turn's ordinary call, and what stands for what.

    ``reason`` is ``compaction`` for a call that summarises old messages, ``fallback`` for an
    attempt made after another provider failed (``after``: that attempt's call index).
    ``replaces`` names the messages a summary stands for: the ones a compaction call
    summarises (earlier summaries' included), or, on a call that sends a summary as its
    injected message 0, the ones that summary replaced; ``summary`` is then the index of the
    compaction call that wrote it.
    """

    reason: str | None = None
    after: int | None = None
    replaces: Window = ()
    summary: int | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if self.reason is not None:
            body["reason"] = self.reason
        if self.after is not None:
            body["after"] = self.after
        if self.replaces:
            body["replaces"] = [[start, end] for start, end in self.replaces]
        if self.summary is not None:
            body["summary"] = self.summary
        return body

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> Lineage | None:
        """The lineage fields of a call entry; None when it has none (or they are malformed)."""
        reason, after, summary = entry.get("reason"), entry.get("after"), entry.get("summary")
        replaces = entry.get("replaces", [])
        if reason is None and after is None and summary is None and not replaces:
            return None
        ranges: list[tuple[int, int]] = []
        for pair in replaces if isinstance(replaces, list) else [None]:
            if (not isinstance(pair, list) or len(pair) != 2
                    or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair)):
                return None
            ranges.append((pair[0], pair[1]))
        if not (reason is None or isinstance(reason, str)):
            return None
        if not all(v is None or (isinstance(v, int) and not isinstance(v, bool))
                   for v in (after, summary)):
            return None
        return cls(reason=reason, after=after, replaces=tuple(ranges), summary=summary)


NO_LINEAGE = Lineage()


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
    lineage: Lineage = NO_LINEAGE
    endpoint: str | None = None
    """Where the call goes (the provider's base URL, or just its origin); recorded beside the
    request as its origin only (:func:`sessions.endpoint.origin`), never part of the body."""
    inbound: int | None = None
    """The index of the message whose turn makes the call (the turn's trace is derived from
    it: :mod:`sessions.traces`); None outside a turn (a rerun)."""


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
    answer: MessageDict | None = None
    """The answer of a call whose answer is not a message entry (a compaction summary)."""


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
