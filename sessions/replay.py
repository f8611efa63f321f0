"""Offline replay: rebuild every provider call of a session log. Pure: bytes in, objects out.

A *call* is one provider request (a *turn*, which answers one inbound message, makes one or
more). In format v3 each ``call`` entry opens a call and the assistant message after it closes
it (a call that failed has no assistant message). In v1/v2, as in the seed project, each
assistant message closes a call, its prompt is the nearest preceding prompt
entry, and the messages sent are all earlier messages.

Honesty rules: calls before the first prompt entry keep a null prompt (never back-filled); a v1
log says its prompt was not recorded; a v2/v3 log with calls but no prompt entry says prompt
persistence likely failed. A torn last line (one with no newline after it: a write that was
interrupted) is tolerated; a corrupt complete line, the last one included, becomes a
:class:`Problem` with its line number. An empty file or a bad header raises
:class:`~sessions.errors.SessionReadError` (the only error replay raises for bad input).

Cost is O(file size): message entries are kept as byte offsets into the log and parsed when
asked for, and calls carry window bounds, never copies of the transcript.
"""

from __future__ import annotations

import gc
import math
import sys
from array import array
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, TypeGuard

import orjson

from sessions.caching import glued_at
from sessions.encoding import ESCAPED, unescape
from sessions.erased import ERASED as ERASED_KEY
from sessions.erased import erased_at, is_marker
from sessions.errors import (
    CorruptHeaderError,
    EmptySessionError,
)
from sessions.fingerprint import fingerprint
from sessions.records import (
    PROMPT_JOINER,
    CachePlan,
    Injected,
    Lineage,
    Window,
)
from sessions.replay_model import (
    ERASED,
    NOT_REBUILDABLE,
    NOT_RECORDED,
    NOTICE_BEFORE_FIRST,
    NOTICE_CALL_UNRECORDED,
    NOTICE_NO_PROMPTS,
    NOTICE_PROMPT_MISSING,
    NOTICE_V1,
    REBUILT,
    Call,
    Delivered,
    Gap,
    MessageLog,
    NotRebuildableError,
    Outcome,
    Problem,
    PromptVersion,
    Refused,
    Replay,
    Replied,
    RerunOf,
    SectionRef,
    Status,
)

__all__ = [  # the model's names stay importable from here, where callers always found them
    "ERASED",
    "NOTICE_BEFORE_FIRST",
    "NOTICE_CALL_UNRECORDED",
    "NOTICE_NO_PROMPTS",
    "NOTICE_PROMPT_MISSING",
    "NOTICE_V1",
    "NOT_REBUILDABLE",
    "NOT_RECORDED",
    "REBUILT",
    "Call",
    "Delivered",
    "Gap",
    "MessageLog",
    "NotRebuildableError",
    "Outcome",
    "Problem",
    "PromptVersion",
    "Refused",
    "Replay",
    "Replied",
    "RerunOf",
    "SectionRef",
    "Status",
    "replay_bytes",
]

# -- parsing -----------------------------------------------------------------------------------


class _Builder:
    """Mutable state of one pass over the lines; frozen into a :class:`Replay` at the end."""

    def __init__(self, data: bytes, version: int) -> None:
        self.data = data
        self.version = version
        self.starts: array[int] = array("q")
        self.ends: array[int] = array("q")
        self.problems: list[Problem] = []
        self.sections: dict[str, str] = {}
        self.tool_sets: dict[str, tuple[Mapping[str, Any], ...]] = {}
        self.prompts: list[dict[str, Any]] = []  # mutable drafts of PromptVersion
        self.prompt_by_fp: dict[str, int] = {}
        self.calls: list[dict[str, Any]] = []
        self.pending: dict[str, Any] | None = None
        self.outcomes: dict[int, Outcome] = {}
        self.last_seq: int | None = None
        self.gaps: list[Gap] = []
        self.refusals: list[Refused] = []
        self.erased: dict[int, str | None] = {}
        """Message indices an erasure replaced by its marker, and when."""
        self.replies: list[Replied] = []
        self.deliveries: list[Delivered] = []
        self.damaged: int | None = None
        """Line of the first damage that can shift message indices (a lost or corrupt line)."""

    def problem(self, line: int, message: str) -> None:
        self.problems.append(Problem(line, message))

    def damage(self, line: int, message: str) -> None:
        """A problem after which message indices may be off: later calls are not rebuilt."""
        self.problem(line, message)
        if self.damaged is None:
            self.damaged = line

    # Each handler gets the parsed entry and its 1-based line number.

    def on_message(self, entry: dict[str, Any], line: int, start: int, end: int) -> None:
        msg = entry.get("message")
        if not (
            isinstance(msg, dict)
            and isinstance(msg.get("role"), str)
            and isinstance(msg.get("content"), (str, list))
        ):
            self.damage(line, "message entry without a valid role/content")
            return
        index = len(self.starts)
        self.starts.append(start)
        self.ends.append(end)
        if ERASED_KEY in entry and is_marker(entry):
            self.erased[index] = erased_at(entry)
        if msg["role"] != "assistant":
            return
        ts = _str_or_none(entry.get("ts"))
        if self.version >= 3:
            if self.pending is not None:
                self.pending["assistant"] = index
                self.calls.append(self.pending)
                self.pending = None
            else:
                draft = _call_draft(line, ts, None, NOTICE_CALL_UNRECORDED, None,
                                    assistant=index)
                draft["status"] = (NOT_RECORDED, "no call entry; its failure left no trace")
                self.calls.append(draft)
            return
        prompt = len(self.prompts) - 1 if self.prompts else None
        notice = None
        if prompt is None:
            notice = NOTICE_V1 if self.version < 2 else NOTICE_BEFORE_FIRST
        self.calls.append(_call_draft(line, ts, prompt, notice, ((0, index),), assistant=index))

    def on_refusal(self, entry: dict[str, Any], line: int) -> None:
        limit = entry.get("limit")
        if not isinstance(limit, str):
            self.problem(line, "refusal entry without a limit")
            return
        self.refusals.append(Refused(line, _str_or_none(entry.get("ts")), limit,
                                     _str_or_none(entry.get("until")), len(self.starts)))

    def on_reply(self, entry: dict[str, Any], line: int) -> None:
        kind, text, message = entry.get("kind"), entry.get("text"), entry.get("message")
        if not isinstance(kind, str) or not isinstance(text, str):
            self.problem(line, "reply entry without kind/text")
            return
        self.replies.append(Replied(line, _str_or_none(entry.get("ts")), kind,
                                    message if type(message) is int else None, text))

    def on_delivery(self, entry: dict[str, Any], line: int) -> None:
        part, ref, message = entry.get("part"), entry.get("ref"), entry.get("message")
        if type(part) is not int or not isinstance(ref, dict):
            self.problem(line, "delivery entry without part/ref")
            return
        self.deliveries.append(Delivered(line, _str_or_none(entry.get("ts")),
                                         message if type(message) is int else None, part, ref))

    def on_gap(self, entry: dict[str, Any], line: int) -> None:
        kind, at, refused = entry.get("kind"), entry.get("at"), entry.get("refused")
        if not isinstance(kind, str) or not isinstance(refused, list):
            self.problem(line, "gap entry without kind/refused")
            return
        at = _str_or_none(at)
        items = tuple(r for r in refused if isinstance(r, dict))
        self.gaps.append(Gap(line, kind, at, items))
        when = f"{kind} at {at}" if at else kind
        for item in items:
            what = item.get("type")
            if what == "call":
                if self.pending is not None:
                    self.calls.append(self.pending)
                self.pending = _call_draft(line, at, None, NOTICE_CALL_UNRECORDED, None)
                self.pending["status"] = (NOT_RECORDED, f"persist failed: {when}")
            elif what == "message" and item.get("role") == "assistant":
                if self.pending is not None:  # the call's answer never reached the log
                    self.pending["notes"].append(f"its answer was not recorded ({when})")
                    self.calls.append(self.pending)
                    self.pending = None
            elif what == "outcome" and self.pending is not None:
                self.pending["notes"].append(f"its outcome was not recorded ({when})")

    def on_section(self, entry: dict[str, Any], line: int) -> None:
        h, text = entry.get("hash"), entry.get("text")
        if not isinstance(h, str) or not isinstance(text, str):
            self.problem(line, "section entry without hash/text")
            return
        if fingerprint(text) != h:
            self.problem(line, f"section {h} text does not match its hash")
        self.sections[h] = text

    def on_prompt(self, entry: dict[str, Any], line: int) -> None:
        fp = entry.get("fingerprint")
        if not isinstance(fp, str):
            self.problem(line, "prompt entry without a fingerprint")
            return
        refs: list[SectionRef] = []
        text: str | None
        inline = entry.get("text")
        raw_sections = entry.get("sections")
        if isinstance(inline, str):
            text = inline
            refs.append(SectionRef("prompt", fingerprint(inline), inline))
        elif isinstance(raw_sections, list):
            parts: list[str] | None = []
            for ref in raw_sections:
                if not isinstance(ref, dict) or not isinstance(ref.get("hash"), str):
                    self.problem(line, "prompt section reference is malformed")
                    parts = None
                    break
                body = self.sections.get(ref["hash"])
                name = ref.get("name")
                refs.append(SectionRef(name if isinstance(name, str) else "?", ref["hash"], body))
                if body is None:
                    self.problem(line, f"prompt names section {ref['hash']} not found before it")
                    parts = None
                elif parts is not None:
                    parts.append(body)
            joiner = entry.get("joiner", PROMPT_JOINER)
            text = (joiner if isinstance(joiner, str) else PROMPT_JOINER).join(parts) \
                if parts is not None else None
        else:
            self.problem(line, "prompt entry has neither text nor sections")
            return
        verified = text is not None and fingerprint(text) == fp
        if text is not None and not verified:
            self.problem(line, f"rebuilt prompt does not match fingerprint {fp}")
        reason = entry.get("reason")
        self.prompt_by_fp[fp] = len(self.prompts)
        self.prompts.append({
            "number": len(self.prompts) + 1, "line": line, "ts": _str_or_none(entry.get("ts")),
            "fingerprint": fp, "reason": reason if isinstance(reason, str) else None,
            "sections": tuple(refs), "text": text, "verified": verified, "first_call": None,
        })

    def on_tools(self, entry: dict[str, Any], line: int) -> None:
        fp, tools = entry.get("fingerprint"), entry.get("tools")
        if not isinstance(fp, str) or not isinstance(tools, list):
            self.problem(line, "tools entry without fingerprint/tools")
            return
        if not all(isinstance(tool, dict) for tool in tools):
            self.problem(line, "tools entry holds a tool schema that is not an object")
            return
        self.tool_sets[fp] = tuple(tools)

    def on_call(self, entry: dict[str, Any], line: int) -> None:
        if self.pending is not None:  # the previous call got no answer (error or crash)
            self.calls.append(self.pending)
        window = _window(entry.get("window"), len(self.starts))
        if window is None:
            self.problem(line, "call entry has a malformed window")
        injected = _injected(entry.get("injected"))
        if injected is None:
            self.problem(line, "call entry has malformed injected messages")
        fp = entry.get("prompt")
        prompt = self.prompt_by_fp.get(fp) if isinstance(fp, str) else None
        notice = None if prompt is not None else NOTICE_PROMPT_MISSING
        tools = entry.get("tools")
        params = entry.get("params")
        call = entry.get("call")
        self.pending = _call_draft(
            line, _str_or_none(entry.get("ts")), prompt, notice, window, injected=injected or (),
            call=call if isinstance(call, int) else None,
            provider=_str_or_none(entry.get("provider")), model=_str_or_none(entry.get("model")),
            params=params if isinstance(params, dict) else None,
            tools=tools if isinstance(tools, str) else None,
            cache=CachePlan.from_json(entry.get("cache")),
            lineage=Lineage.from_json(entry),
            endpoint=_str_or_none(entry.get("endpoint")),
            inbound=inbound if type(inbound := entry.get("inbound")) is int and inbound >= 0
            else None,
        )
        self.pending["prompt_fp"] = fp if isinstance(fp, str) else None
        if injected is None:
            self.pending["status"] = (NOT_REBUILDABLE, "its injected messages are malformed")
        elif "cache" in entry and self.pending["cache"] is None:
            self.pending["status"] = (NOT_REBUILDABLE, "its prompt-cache plan is malformed")
        if isinstance(tools, str) and tools not in self.tool_sets:
            self.problem(line, f"call names tool set {tools} not found before it")

    def on_outcome(self, entry: dict[str, Any], line: int) -> None:
        call = entry.get("call")
        if not isinstance(call, int):
            return
        usage, error, latency = entry.get("usage"), entry.get("error"), entry.get("latency_ms")
        self.outcomes[call] = Outcome(  # stop_reason, usage, latency_ms, error, response
            _str_or_none(entry.get("stop_reason")),
            usage if isinstance(usage, dict) else None,
            float(latency) if isinstance(latency, (int, float)) else None,
            error if isinstance(error, dict) else None,
            _str_or_none(entry.get("response_id")),
            _str_or_none(entry.get("response_model")),
            _cost_or_none(entry.get("cost_usd")),
            answer if _is_message(answer := entry.get("answer")) else None,
        )

    def check_seq(self, entry: dict[str, Any], line: int) -> None:
        seq = entry.get("seq")
        if not isinstance(seq, int):
            self.problem(line, "v3 entry without an integer seq")
            return
        if self.last_seq is not None and seq != self.last_seq + 1:
            kind = "duplicate or out-of-order" if seq <= self.last_seq else "gap before"
            self.damage(line, f"seq {seq}: {kind} (previous {self.last_seq})")
        self.last_seq = seq

    def finish(self, header: Mapping[str, Any], torn: bool) -> Replay:
        if self.pending is not None:
            self.calls.append(self.pending)
            self.pending = None
        calls: list[Call] = []
        for number, draft in enumerate(self.calls, start=1):
            p = draft["prompt"]
            if p is not None and self.prompts[p]["first_call"] is None:
                self.prompts[p]["first_call"] = number
        versions = tuple(PromptVersion(**draft) for draft in self.prompts)
        for number, d in enumerate(self.calls, start=1):
            p = d["prompt"]
            version = versions[p] if p is not None else None
            status, why = d["status"] or _judge_call(self, d, version)
            cache = d["cache"]
            if (cache is not None and not cache.joined and status == REBUILT
                    and version is not None and d["provider"] != "openai"):
                glued = glued_at(cache, [ref.text or "" for ref in version.sections])
                if glued is not None:
                    d["notes"].append(_glued_note(version, glued))
            # Positional: a keyword splat per call is measurably slower on long sessions.
            calls.append(Call(number, d["line"], d["ts"], version,
                              d["prompt_notice"], d["window"], d["injected"], d["assistant"],
                              d["call"], d["provider"], d["model"], d["params"],
                              d["tools_fingerprint"], status, why, tuple(d["notes"]), d["cache"],
                              d["lineage"], d["endpoint"], d["inbound"]))
        notice = None
        if self.version < 2:
            notice = NOTICE_V1
        elif not versions and calls:
            notice = NOTICE_NO_PROMPTS
        if notice == NOTICE_NO_PROMPTS:
            calls = [_with_notice(t, NOTICE_NO_PROMPTS) for t in calls]
        return Replay(
            gaps=tuple(self.gaps),
            refusals=tuple(self.refusals),
            replies=tuple(self.replies),
            deliveries=tuple(self.deliveries),
            header=header,
            version=self.version,
            messages=MessageLog(self.data, self.starts, self.ends),
            prompts=versions,
            calls=tuple(calls),
            tool_sets=self.tool_sets,
            outcomes=self.outcomes,
            problems=tuple(self.problems),
            torn_tail=torn,
            notice=notice,
        )


def _judge_call(builder: _Builder, d: dict[str, Any],
                version: PromptVersion | None) -> tuple[Status, str | None]:
    """Whether a call's request can be rebuilt from the log, and if not, what is missing."""
    if builder.version < 3:
        return NOT_RECORDED, f"format v{builder.version} predates call recording"
    if builder.damaged is not None and builder.damaged < d["line"]:
        return NOT_REBUILDABLE, (f"damaged or missing entries before it, from line "
                                 f"{builder.damaged}")
    if d["window"] is None:
        return NOT_REBUILDABLE, "its message window is malformed"
    if builder.erased and (gone := _erased_in(builder.erased, d["window"])) is not None:
        return ERASED, gone
    if version is None:
        return NOT_REBUILDABLE, f"missing prompt entry {d['prompt_fp'] or '(none named)'}"
    if version.text is None:
        missing = [ref.hash for ref in version.sections if ref.text is None]
        return NOT_REBUILDABLE, f"missing section {', '.join(missing) or '(malformed)'}"
    if not version.verified:
        return NOT_REBUILDABLE, f"prompt {version.fingerprint} does not match its text"
    tools = d["tools_fingerprint"]
    if tools is not None and tools not in builder.tool_sets:
        return NOT_REBUILDABLE, f"missing tool set {tools}"
    cache = d["cache"]
    if cache is not None and cache.system > len(version.sections):
        return NOT_REBUILDABLE, (f"its prompt-cache plan cuts after section {cache.system} of "
                                 f"{len(version.sections)}")
    return REBUILT, None


def _glued_note(version: PromptVersion, cut: int) -> str:
    """What a call recorded with an old cache plan (no ``joined``) sent: its two system blocks
    without the joiner between them, so two sections ran together."""
    before, after = version.sections[cut - 1].name, version.sections[cut].name
    return (f"sent with an older prompt-cache split: its system blocks left out the blank line "
            f"between sections {cut} ({before}) and {cut + 1} ({after}), so the model read them "
            f"run together; the system prompt shown is the one it read, and the request is "
            f"rebuilt as it was sent")


def _erased_in(erased: Mapping[int, str | None], window: Window) -> str | None:
    """Why a call whose window holds an erased message cannot be rebuilt (``None``: none)."""
    found = sorted(i for i in erased for start, end in window if start <= i < end)
    if not found:
        return None
    when = sorted({at for i in found if (at := erased[i])})
    on = f" on {when[-1]}" if when else ""
    return (f"{len(found)} message(s) it sent were erased{on}; the log keeps a marker in "
            "their place")


def _with_notice(call: Call, notice: str) -> Call:
    """A session-wide notice replaces the generic per-call one, not a more specific one."""
    if call.prompt is not None or call.prompt_notice not in (None, NOTICE_BEFORE_FIRST):
        return call
    return replace(call, prompt_notice=notice)


def _cost_or_none(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _call_draft(
    line: int,
    ts: str | None,
    prompt: int | None,
    notice: str | None,
    window: Window | None,
    *,
    injected: tuple[Injected, ...] = (),
    assistant: int | None = None,
    call: int | None = None,
    provider: str | None = None,
    model: str | None = None,
    params: Mapping[str, Any] | None = None,
    tools: str | None = None,
    cache: CachePlan | None = None,
    lineage: Lineage | None = None,
    endpoint: str | None = None,
    inbound: int | None = None,
) -> dict[str, Any]:
    return {
        "line": line, "ts": ts, "prompt": prompt, "prompt_notice": notice, "window": window,
        "injected": injected, "assistant": assistant, "call": call, "provider": provider,
        "model": model, "params": params, "tools_fingerprint": tools, "status": None,
        "notes": [], "prompt_fp": None, "cache": cache,
        "lineage": lineage, "endpoint": endpoint, "inbound": inbound,
    }


def _is_message(msg: Any) -> TypeGuard[dict[str, Any]]:
    """What :meth:`_Builder.on_message` accepts (inlined there: it is the hot path)."""
    return (
        isinstance(msg, dict)
        and isinstance(msg.get("role"), str)
        and isinstance(msg.get("content"), (str, list))
    )


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _window(raw: Any, available: int) -> Window | None:
    if not isinstance(raw, list):
        return None
    out: list[tuple[int, int]] = []
    for pair in raw:
        # type() rather than isinstance(): a JSON true/false must not pass as 1/0.
        if not (type(pair) is list and len(pair) == 2):
            return None
        start, end = pair
        if not (type(start) is int and type(end) is int and 0 <= start <= end <= available):
            return None
        out.append((start, end))
    return tuple(out)


def _injected(raw: Any) -> tuple[Injected, ...] | None:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        return None
    out: list[Injected] = []
    for item in raw:
        # type() rather than isinstance(): a JSON true/false must not pass as 1/0. The bound
        # keeps list.insert() from overflowing on a corrupt position.
        if not (
            isinstance(item, dict)
            and type(item.get("position")) is int
            and 0 <= item["position"] <= sys.maxsize
            and _is_message(item.get("message"))
        ):
            return None
        out.append(Injected(item["position"], item["message"]))
    return tuple(out)


def _parse_header(data: bytes, end: int) -> tuple[dict[str, Any], int]:
    try:
        head = orjson.loads(memoryview(data)[:end])
    except orjson.JSONDecodeError as exc:
        raise CorruptHeaderError("header is not valid JSON", line=1) from exc
    if not isinstance(head, dict) or head.get("type") != "session":
        raise CorruptHeaderError("line 1 is not a session header", line=1)
    version = head.get("version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CorruptHeaderError(f"header has an invalid version {version!r}", line=1)
    return head, version


def replay_bytes(data: bytes) -> Replay:
    """Replay a whole session log given as bytes."""
    # Replay allocates only acyclic containers (dicts, lists, tuples from orjson and our
    # records), which reference counting frees on its own; the cyclic collector would only
    # re-traverse the survivors (calls, prompt versions) again and again, costing 5-10 % on
    # large logs. It is paused for this synchronous call only and restored after, whatever
    # state it was in.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _replay(data)
    finally:
        if was_enabled:
            gc.enable()


def _replay(data: bytes) -> Replay:
    if not data.strip():
        raise EmptySessionError("session file is empty")
    first_end = data.find(b"\n")
    if first_end == -1:
        # A header with no newline after it was torn mid-write: there is nothing to replay.
        raise EmptySessionError("session holds only a torn header line")
    header, version = _parse_header(data, first_end)
    builder = _Builder(data, version)
    view = memoryview(data)
    loads = orjson.loads
    pos = first_end + 1
    line = 1
    size = len(data)
    torn = False
    v3 = version >= 3
    if v3:
        builder.check_seq(header, 1)
    while pos < size:
        line += 1
        end = data.find(b"\n", pos)
        if end == -1:
            torn = True  # the last line was never finished: skip it, as the format allows
            break
        try:
            entry = loads(view[pos:end])
        except orjson.JSONDecodeError:
            # Torn means unterminated (handled above): a newline-terminated line that does not
            # parse was written whole and is corrupt, wherever it is, the last line included.
            if end > pos:
                builder.damage(line, "not valid JSON")
            pos = end + 1
            continue
        if not isinstance(entry, dict):
            builder.damage(line, "not a JSON object")
            pos = end + 1
            continue
        if ESCAPED in entry:  # an entry the fast encoder could not take exactly
            entry = unescape(entry)
        if v3:
            # Fast path for the common case (the next seq); anything else is judged and
            # reported by check_seq.
            seq = entry.get("seq")
            if type(seq) is int and seq - 1 == builder.last_seq:
                builder.last_seq = seq
            else:
                builder.check_seq(entry, line)
        kind = entry.get("type")
        if kind == "message":
            builder.on_message(entry, line, pos, end)
        elif kind == "call":
            builder.on_call(entry, line)
        elif kind == "outcome":
            builder.on_outcome(entry, line)
        elif kind == "section":
            builder.on_section(entry, line)
        elif kind == "prompt":
            builder.on_prompt(entry, line)
        elif kind == "tools":
            builder.on_tools(entry, line)
        elif kind == "gap":
            builder.on_gap(entry, line)
        elif kind == "refusal":
            builder.on_refusal(entry, line)
        elif kind == "reply":
            builder.on_reply(entry, line)
        elif kind == "delivery":
            builder.on_delivery(entry, line)
        elif kind == "session":
            builder.problem(line, "a second session header")
        # any other type (reflection, model_change, future types) is skipped on purpose
        pos = end + 1
    return builder.finish(header, torn)
