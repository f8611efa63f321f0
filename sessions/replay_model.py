"""What replay rebuilds from one log: the calls (:class:`Call`), prompt versions, outcomes,
gaps and refusals, the messages as byte offsets (:class:`MessageLog`), and :class:`Replay`,
which holds them and builds a call's request body. :mod:`sessions.replay` fills them in."""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, overload

import orjson

from sessions.attachments import BlobRef, needed
from sessions.caching import sent_system
from sessions.encoding import ESCAPED, unescape
from sessions.errors import (
    BlobMissingError,
    SessionReadError,
)
from sessions.records import (
    CachePlan,
    Injected,
    Lineage,
    MessageDict,
    Window,
    window_messages,
)
from sessions.shapes import Shape, request_body

NOTICE_V1 = "system prompt not recorded (predates prompt recording)"
NOTICE_NO_PROMPTS = "no prompt entry in this session: prompt persistence likely failed"
NOTICE_BEFORE_FIRST = "no prompt recorded before this call (not back-filled)"
NOTICE_CALL_UNRECORDED = "this call was not recorded (prompt persistence failed for it)"
NOTICE_PROMPT_MISSING = "the call names a prompt that is not in the log"

Status = Literal["rebuilt", "not_recorded", "not_rebuildable", "erased"]
REBUILT: Final = "rebuilt"
NOT_RECORDED: Final = "not_recorded"
NOT_REBUILDABLE: Final = "not_rebuildable"
ERASED: Final = "erased"
"""Per call: rebuilt exactly from the log; not recorded at all; recorded but missing a piece
the request needs; or it sent a message whose sender was erased since (the log keeps a marker
in its place, :mod:`sessions.erased`). Replay never offers a body for the last three."""


@dataclass(frozen=True, slots=True)
class Problem:
    """Something wrong in the log that replay survived. ``line`` is 1-based."""

    line: int
    message: str


@dataclass(frozen=True, slots=True)
class SectionRef:
    name: str
    hash: str
    text: str | None


@dataclass(frozen=True, slots=True)
class PromptVersion:
    """One prompt entry: a version of the system prompt and when and why it appeared."""

    number: int
    line: int
    ts: str | None
    fingerprint: str
    reason: str | None
    sections: tuple[SectionRef, ...]
    text: str | None
    verified: bool
    first_call: int | None


@dataclass(frozen=True, slots=True)
class Outcome:
    stop_reason: str | None
    usage: Mapping[str, Any] | None
    latency_ms: float | None
    error: Mapping[str, Any] | None
    response_id: str | None = None
    response_model: str | None = None
    cost_usd: float | None = None
    answer: MessageDict | None = None
    """A compaction call's summary (its answer is not a message entry)."""


@dataclass(frozen=True, slots=True)
class Call:
    """One provider call. Indices point into :attr:`Replay.messages`; ``index`` is 1-based."""

    index: int
    line: int
    ts: str | None
    prompt: PromptVersion | None
    prompt_notice: str | None
    window: Window | None
    injected: tuple[Injected, ...]
    assistant: int | None
    entry_number: int | None
    """The number its ``call`` entry gives it (0-based; None without a call entry)."""
    provider: str | None
    model: str | None
    params: Mapping[str, Any] | None
    tools_fingerprint: str | None
    status: Status = REBUILT
    why: str | None = None
    """Why the call cannot be rebuilt (``None`` when it can)."""
    notes: tuple[str, ...] = ()
    """What else the log says about this call (an answer or outcome the writer refused)."""
    cache: CachePlan | None = None
    """The prompt-cache breakpoints the call placed (:mod:`sessions.caching`), if any."""
    lineage: Lineage | None = None
    """Why the call was made (compaction, fallback) and which summary it sent, if any."""
    endpoint: str | None = None
    """Where the call went, ``scheme://host:port`` (logs written before it was recorded, and
    calls to an in-process provider, have none)."""
    inbound: int | None = None
    """The index of the message whose turn made the call, as its entry records it (logs
    written before it was recorded, and reruns, have none)."""

    @property
    def rebuildable(self) -> bool:
        return self.status == REBUILT

    @property
    def status_text(self) -> str:
        """``rebuilt``, ``not recorded (WHY)``, ``recorded but not rebuildable (WHY)`` or
        ``erased (WHY)``."""
        if self.status == NOT_RECORDED:
            return f"not recorded ({self.why})"
        if self.status == NOT_REBUILDABLE:
            return f"recorded but not rebuildable ({self.why})"
        if self.status == ERASED:
            return f"erased ({self.why})"
        return "rebuilt"


@dataclass(frozen=True, slots=True)
class Gap:
    """A ``gap`` entry: entries the writer refused, why and when (``refused`` summarises them:
    type, a message's role, an outcome's call; never contents)."""

    line: int
    kind: str
    at: str | None
    refused: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True, slots=True)
class Refused:
    """A ``refusal`` entry: a turn a budget or rate limit stopped before any provider call
    (so it has no call of its own). ``after`` is how many messages the log held then: the
    message it refused is the last of them, the polite answer the next."""

    line: int
    ts: str | None
    limit: str
    until: str | None
    after: int


@dataclass(frozen=True, slots=True)
class RerunOf:
    """What a rerun log (``gateway replay --rerun N --save``) reruns: the header's
    ``rerunOf``."""

    session: str
    tenant: str | None
    call: int | None

    @classmethod
    def from_header(cls, header: Mapping[str, Any]) -> RerunOf | None:
        """The header's ``rerunOf``, or None when it has none. Its call number is ``call``;
        rerun logs written before calls were called calls name it ``turn``, read the same."""
        value = header.get("rerunOf")
        if not isinstance(value, Mapping) or not isinstance(value.get("session"), str):
            return None
        number = value.get("call", value.get("turn"))
        tenant = value.get("tenant")
        return cls(value["session"], tenant if isinstance(tenant, str) else None,
                   number if type(number) is int else None)


@dataclass(frozen=True, slots=True)
class Replied:
    """A ``reply`` entry: an answer that is not a model's (``kind`` ``notice``: every file of
    the message was refused; ``apology``: its turn failed), recorded before it went out, to
    the message at index ``message``."""

    line: int
    ts: str | None
    kind: str
    message: int | None
    text: str


@dataclass(frozen=True, slots=True)
class Delivered:
    """A ``delivery`` entry: platform message ``part`` of the answer to the message at index
    ``message`` (``ref``: the channel's own data, e.g. Telegram's chat and message id), noted
    before the answer's text went into it."""

    line: int
    ts: str | None
    message: int | None
    part: int
    ref: Mapping[str, Any]


class NotRebuildableError(SessionReadError):
    """A request body was asked of a call replay cannot rebuild; the message says why."""


class MessageLog(Sequence[MessageDict]):
    """The session's messages, parsed on access from the log bytes (no transcript copies)."""

    __slots__ = ("_data", "_ends", "_starts")

    def __init__(self, data: bytes, starts: array[int], ends: array[int]) -> None:
        self._data = memoryview(data)
        self._starts = starts
        self._ends = ends

    def __len__(self) -> int:
        return len(self._starts)

    def entry(self, index: int) -> dict[str, Any]:
        """The whole message entry (``seq``, ``ts``, ``message``, ``meta``)."""
        value: dict[str, Any] = orjson.loads(self._data[self._starts[index] : self._ends[index]])
        return unescape(value) if ESCAPED in value else value

    @overload
    def __getitem__(self, index: int) -> MessageDict: ...

    @overload
    def __getitem__(self, index: slice) -> list[MessageDict]: ...

    def __getitem__(self, index: int | slice) -> MessageDict | list[MessageDict]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        message: MessageDict = self.entry(index)["message"]
        return message

    def __iter__(self) -> Iterator[MessageDict]:
        for i in range(len(self)):
            yield self[i]


@dataclass(frozen=True, slots=True)
class Replay:
    """Everything replay rebuilt from one log."""

    header: Mapping[str, Any]
    version: int
    messages: MessageLog
    prompts: tuple[PromptVersion, ...]
    calls: tuple[Call, ...]
    tool_sets: Mapping[str, tuple[Mapping[str, Any], ...]]
    outcomes: Mapping[int, Outcome]
    problems: tuple[Problem, ...]
    torn_tail: bool
    notice: str | None
    gaps: tuple[Gap, ...] = ()
    refusals: tuple[Refused, ...] = ()
    replies: tuple[Replied, ...] = ()
    deliveries: tuple[Delivered, ...] = ()

    @property
    def session_id(self) -> str:
        return str(self.header.get("id", ""))

    @property
    def rerun_of(self) -> RerunOf | None:
        """The call this log reruns, when it is a saved rerun."""
        return RerunOf.from_header(self.header)

    @property
    def prompts_recorded(self) -> bool:
        return bool(self.prompts)

    def call(self, number: int) -> Call:
        """Call ``number`` (1-based); IndexError when there is no such call."""
        if not 1 <= number <= len(self.calls):
            raise IndexError(f"call {number} out of range 1..{len(self.calls)}")
        return self.calls[number - 1]

    def sent(self, call: Call) -> list[MessageDict]:
        """The messages the provider received for ``call`` (empty when not recorded)."""
        if call.window is None:
            return []
        return window_messages(self.messages, call.window, call.injected)

    def tools_of(self, call: Call) -> tuple[Mapping[str, Any], ...] | None:
        if call.tools_fingerprint is None:
            return None
        return self.tool_sets.get(call.tools_fingerprint)

    def outcome_of(self, call: Call) -> Outcome | None:
        return None if call.entry_number is None else self.outcomes.get(call.entry_number)

    def system_text(self, call: Call) -> str | None:
        """The system prompt ``call`` sent, as the model read it: the text its request's
        system blocks join to (None when its prompt is unknown). That is the recorded prompt's
        text, except for Anthropic calls recorded with an old cache plan that left the joiner
        out between the two system blocks (:func:`sessions.caching.glued_at`; such a call has
        a note saying so)."""
        prompt = call.prompt
        if prompt is None or prompt.text is None:
            return None
        if call.provider == "openai" or call.cache is None:
            return prompt.text
        return sent_system(call.cache, [ref.text or "" for ref in prompt.sections], prompt.text)

    def attachments(self, call: Call) -> list[BlobRef]:
        """The blobs ``call``'s request needs (each once), to load before :meth:`request`."""
        return needed(self.sent(call))

    def request(self, call: Call, shape: Shape | None = None,
                blobs: Mapping[str, bytes] | None = None) -> dict[str, Any]:
        """The provider request body of ``call``, rebuilt (shape defaults to the recorded one).

        ``blobs`` holds the bytes of :meth:`attachments` (hash -> bytes), from the blob store.
        Raises :class:`NotRebuildableError` for a call that was not recorded or misses a piece
        (:attr:`Call.status_text` says which; a blob missing from ``blobs`` is named by hash),
        and
        :class:`~sessions.errors.SessionReadError` when the recorded content blocks or tool
        schemas are too malformed to take that shape (a hand-edited or corrupted log).
        """
        if not call.rebuildable:
            raise NotRebuildableError(f"call {call.index} cannot be rebuilt: "
                                      f"{call.status_text}", line=call.line)
        chosen: Shape
        if shape is not None:
            chosen = shape
        else:
            chosen = "openai" if call.provider == "openai" else "anthropic"
        system = call.prompt.text if call.prompt else None
        sections = (
            tuple(ref.text or "" for ref in call.prompt.sections) if call.prompt else ()
        )
        try:
            return request_body(
                chosen,
                system,
                self.sent(call),
                self.tools_of(call) or (),
                call.model or str(self.header.get("model") or ""),
                call.params or {},
                cache=call.cache,
                sections=sections,
                blobs=blobs,
            )
        except BlobMissingError as exc:  # the log is whole; the blob store lacks a piece
            raise NotRebuildableError(
                f"call {call.index} cannot be rebuilt: recorded but not rebuildable (blob "
                f"sha256 {exc.digest} is not in the blob store: {exc.label})", line=call.line
            ) from exc
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            # The shapes index blocks and schemas as the providers define them; a log may hold
            # anything. Say which call cannot be rebuilt instead of crashing the caller.
            raise SessionReadError(
                f"call {call.index} cannot be rebuilt as a {chosen} request: a recorded content "
                f"block, tool schema or prompt section is malformed or missing "
                f"({type(exc).__name__})", line=call.line
            ) from exc
