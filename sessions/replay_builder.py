"""The state of one pass over a session log: a handler per entry type (``on_message``,
``on_call``, ...) adds each entry's effect to the calls, prompts, messages and problems so far,
and :meth:`Builder.finish` freezes them into a :class:`~sessions.replay_model.Replay`.

Separate from :mod:`sessions.replay`, which splits the bytes into lines, parses them, handles
the header and the torn tail and dispatches each entry here: the builder gets parsed entries
with their line numbers (and a message's byte offsets), never a line to split or parse.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from typing import Any

from sessions.caching import glued_at
from sessions.erased import ERASED as ERASED_KEY
from sessions.erased import erased_at, is_marker
from sessions.fingerprint import fingerprint
from sessions.records import (
    PROMPT_JOINER,
    CachePlan,
    Injected,
    Lineage,
    Window,
)
from sessions.replay_fields import (
    cost_or_none,
    injected_or_none,
    is_message,
    str_or_none,
    window_or_none,
)
from sessions.replay_judge import glued_note, judge_call, with_notice
from sessions.replay_model import (
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
    Outcome,
    Problem,
    PromptVersion,
    Refused,
    Replay,
    Replied,
    SectionRef,
)


class Builder:
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
        ts = str_or_none(entry.get("ts"))
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
        self.refusals.append(Refused(line, str_or_none(entry.get("ts")), limit,
                                     str_or_none(entry.get("until")), len(self.starts)))

    def on_reply(self, entry: dict[str, Any], line: int) -> None:
        kind, text, message = entry.get("kind"), entry.get("text"), entry.get("message")
        if not isinstance(kind, str) or not isinstance(text, str):
            self.problem(line, "reply entry without kind/text")
            return
        self.replies.append(Replied(line, str_or_none(entry.get("ts")), kind,
                                    message if type(message) is int else None, text))

    def on_delivery(self, entry: dict[str, Any], line: int) -> None:
        part, ref, message = entry.get("part"), entry.get("ref"), entry.get("message")
        if type(part) is not int or not isinstance(ref, dict):
            self.problem(line, "delivery entry without part/ref")
            return
        self.deliveries.append(Delivered(line, str_or_none(entry.get("ts")),
                                         message if type(message) is int else None, part, ref))

    def on_gap(self, entry: dict[str, Any], line: int) -> None:
        kind, at, refused = entry.get("kind"), entry.get("at"), entry.get("refused")
        if not isinstance(kind, str) or not isinstance(refused, list):
            self.problem(line, "gap entry without kind/refused")
            return
        at = str_or_none(at)
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
            "number": len(self.prompts) + 1, "line": line, "ts": str_or_none(entry.get("ts")),
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
        window = window_or_none(entry.get("window"), len(self.starts))
        if window is None:
            self.problem(line, "call entry has a malformed window")
        injected = injected_or_none(entry.get("injected"))
        if injected is None:
            self.problem(line, "call entry has malformed injected messages")
        fp = entry.get("prompt")
        prompt = self.prompt_by_fp.get(fp) if isinstance(fp, str) else None
        notice = None if prompt is not None else NOTICE_PROMPT_MISSING
        tools = entry.get("tools")
        params = entry.get("params")
        call = entry.get("call")
        self.pending = _call_draft(
            line, str_or_none(entry.get("ts")), prompt, notice, window, injected=injected or (),
            call=call if isinstance(call, int) else None,
            provider=str_or_none(entry.get("provider")), model=str_or_none(entry.get("model")),
            params=params if isinstance(params, dict) else None,
            tools=tools if isinstance(tools, str) else None,
            cache=CachePlan.from_json(entry.get("cache")),
            lineage=Lineage.from_json(entry),
            endpoint=str_or_none(entry.get("endpoint")),
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
            str_or_none(entry.get("stop_reason")),
            usage if isinstance(usage, dict) else None,
            float(latency) if isinstance(latency, (int, float)) else None,
            error if isinstance(error, dict) else None,
            str_or_none(entry.get("response_id")),
            str_or_none(entry.get("response_model")),
            cost_or_none(entry.get("cost_usd")),
            answer if is_message(answer := entry.get("answer")) else None,
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
            status, why = d["status"] or judge_call(self, d, version)
            cache = d["cache"]
            if (cache is not None and not cache.joined and status == REBUILT
                    and version is not None and d["provider"] != "openai"):
                glued = glued_at(cache, [ref.text or "" for ref in version.sections])
                if glued is not None:
                    d["notes"].append(glued_note(version, glued))
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
            calls = [with_notice(t, NOTICE_NO_PROMPTS) for t in calls]
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
