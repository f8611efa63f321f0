"""HTML of the pieces of a session: messages, prompt-change markers and provider calls.

Pure functions from :class:`~sessions.replay.Replay` objects to :class:`Markup`; all session
content goes through :func:`~app.admin.markup.tag`, which escapes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.admin import urls
from app.admin.attachments import attachment_view
from app.admin.markup import Markup, join, tag
from sessions.cache_bust import CacheBust
from sessions.encoding import dumps
from sessions.replay import Call, Outcome, PromptVersion, Replay
from sessions.scan import message_text


@dataclass(frozen=True, slots=True)
class Where:
    """Which session a piece belongs to, for the links it carries."""

    session_id: str
    tenant: str
    home: str


def pretty(value: Any) -> str:
    """Indented JSON for display, exact for every value a log holds (sessions.encoding)."""
    return dumps(value, indent=True).decode()


def compact(value: Any) -> str:
    return dumps(value).decode()


# -- messages ----------------------------------------------------------------------------------


def _tool_result_text(content: Any) -> str:
    text = message_text(content)
    return text if text is not None else pretty(content)


def _call_facts(call: Mapping[str, Any] | None) -> list[Markup | str]:
    """Where a tool result came from and how the call went (the message entry's meta)."""
    if not call:
        return []
    server, name = str(call.get("server", "?")), str(call.get("name", "?"))
    ms = call.get("ms")
    took = f"{ms:.0f} ms" if isinstance(ms, int | float) else "?"
    outcome = str(call.get("outcome", "?"))
    return [" ", tag("code", f"{server}: {name}"), " ", tag("span", took, class_="muted"),
            " ", tag("span", outcome, class_="badge" if outcome == "ok" else "badge warn")]


def block_view(block: Any, where: Where | None = None,
               call: Mapping[str, Any] | None = None) -> Markup:
    """One content block: text, a tool call, a tool result (with ``call``: how its call went,
    server, tool, duration, outcome), an attachment (a thumbnail or a chip, linked to its blob
    when ``where`` says which session), or anything else as JSON."""
    if not isinstance(block, Mapping):
        return tag("pre", pretty(block), class_="json")
    kind = block.get("type")
    if kind == "attachment":
        shown = attachment_view(block, where)
        if shown is not None:
            return shown
    if kind == "text":
        return tag("div", str(block.get("text", "")), class_="text")
    if kind == "tool_use":
        return tag(
            "div",
            tag("div", tag("span", "tool call", class_="label"), " ",
                tag("code", str(block.get("name"))), " ",
                tag("span", str(block.get("id", "")), class_="muted"), class_="block-head"),
            tag("pre", pretty(block.get("input")), class_="json"),
            class_="tool-call",
        )
    if kind == "tool_result":
        error = bool(block.get("is_error"))
        return tag(
            "div",
            tag("div", tag("span", "tool error" if error else "tool result", class_="label"),
                " for ", tag("span", str(block.get("tool_use_id", "")), class_="muted"),
                *_call_facts(call), class_="block-head"),
            tag("pre", _tool_result_text(block.get("content")), class_="result"),
            [attachment_view(b, where) for b in block.get("content") or []
             if isinstance(b, Mapping) and b.get("type") == "attachment"]
            if isinstance(block.get("content"), list) else None,
            class_="tool-result error" if error else "tool-result",
        )
    return tag("details", tag("summary", f"{kind or 'unknown'} block"),
               tag("pre", pretty(block), class_="json"), class_="block-other")


def _role_class(message: Mapping[str, Any]) -> str:
    role = str(message.get("role", "?"))
    content = message.get("content")
    if (role == "user" and isinstance(content, list) and content
            and all(isinstance(b, Mapping) and b.get("type") == "tool_result" for b in content)):
        return "tool"
    return role if role in ("user", "assistant", "system") else "other"


def message_view(message: Mapping[str, Any], *, index: int | None = None,
                 ts: str | None = None, note: str | None = None,
                 where: Where | None = None,
                 meta: Mapping[str, Any] | None = None) -> Markup:
    """A message with its role, log position (1-based) and time; a tool-results message
    also shows, from its ``meta``, which server answered each call, how long and how."""
    kind = _role_class(message)
    label = "tool results" if kind == "tool" else str(message.get("role", "?"))
    head = [tag("span", label, class_="role")]
    if index is not None:
        head.append(tag("span", f"#{index + 1}", class_="muted"))
    if note:
        head.append(tag("span", note, class_="badge"))
    scheduled = (meta or {}).get("scheduled")
    if isinstance(scheduled, Mapping):  # a turn a schedule started, not a person
        head.append(tag("span", f"scheduled {scheduled.get('schedule', '?')}",
                        class_="badge scheduled",
                        title=f"set by {scheduled.get('created_by', '?')}, occurrence "
                              f"{scheduled.get('occurrence', '?')}"))
    if ts:
        head.append(tag("time", ts, class_="muted"))
    content = message.get("content")
    if isinstance(content, str):
        body: Markup = tag("div", content, class_="text")
    elif isinstance(content, list):
        calls = (meta or {}).get("toolCalls")
        by_id = {c.get("id"): c for c in calls if isinstance(c, Mapping)} \
            if isinstance(calls, list) else {}
        body = join(block_view(b, where, by_id.get(b.get("tool_use_id"))
                               if isinstance(b, Mapping) else None) for b in content)
    else:
        body = tag("pre", pretty(content), class_="json")
    return tag("article", tag("header", join(head, " ")), body, class_=f"msg msg-{kind}")


# -- prompt versions ---------------------------------------------------------------------------


def version_label(version: PromptVersion) -> str:
    return f"prompt v{version.number}"


def prompt_marker(version: PromptVersion, where: Where, *, first: bool = False) -> Markup:
    """The line in the conversation where a new prompt version takes effect, and why."""
    title = f"Prompt v{version.number}" if first else f"Prompt changed: v{version.number}"
    parts: list[Markup | str] = [
        tag("strong", title),
        " ",
        tag("span", version.reason or "no reason recorded", class_="reason"),
        " ",
        tag("code", version.fingerprint, class_="muted"),
    ]
    if version.number > 1:
        parts += [" ", tag("a", f"diff v{version.number - 1} → v{version.number}",
                           href=urls.diff(where.session_id, where.tenant, where.home,
                                          version.number - 1, version.number))]
    if not version.verified:
        parts += [" ", tag("span", "unverified", class_="badge warn")]
    return tag("div", *parts, class_="marker", id=f"prompt-v{version.number}",
               data_reason=version.reason or "")


def notice_marker(text: str) -> Markup:
    return tag("div", tag("strong", "Prompt unknown: "), text, class_="marker notice")


# -- provider calls ----------------------------------------------------------------------------


def _usage_text(usage: Mapping[str, Any] | None) -> str | None:
    if not usage:
        return None
    return ", ".join(f"{k} {v}" for k, v in usage.items())


def call_summary(replay: Replay, call: Call, bust: CacheBust | None = None) -> Markup:
    """The one-line summary of a call: number, model, prompt, stop reason, usage, cost, error,
    and ``bust``: the cache-busting change this call was the first to send, if any."""
    outcome = replay.outcome_of(call)
    bits: list[Markup | str] = [tag("strong", f"Call {call.index}")]
    if call.model:
        bits.append(tag("span", call.model))
    bits.append(tag("span", version_label(call.prompt) if call.prompt else "prompt unknown"))
    if outcome is not None:
        if outcome.stop_reason:
            bits.append(tag("span", outcome.stop_reason))
        if outcome.latency_ms is not None:
            bits.append(tag("span", f"{outcome.latency_ms:.0f} ms"))
        usage = _usage_text(outcome.usage)
        if usage:
            bits.append(tag("span", usage, class_="muted"))
        if outcome.cost_usd is not None:
            bits.append(tag("span", money(outcome.cost_usd), class_="cost"))
        if outcome.error:
            bits.append(tag("span", f"error {outcome.error.get('kind', '?')}", class_="badge bad"))
    elif call.assistant is None:
        bits.append(tag("span", "no answer recorded", class_="badge warn"))
    lineage = lineage_text(call)
    if lineage:
        bits.append(tag("span", lineage, class_="badge lineage"))
    if bust is not None:
        bits.append(tag("span", bust.message, class_="badge warn cache-bust",
                        title="the cached prompt prefix was rebuilt from here on"
                              + (" (the stable prefix every conversation shares)"
                                 if bust.stable else "")))
    if not call.rebuildable:  # replay offers no body for it, and says why
        bits.append(tag("span", call.status_text, class_="badge bad", data_status=call.status))
    bits.extend(tag("span", note, class_="badge warn") for note in call.notes)
    return join(bits, " · ")


def money(value: float) -> str:
    """US dollars, with enough places for a single call's fraction of a cent."""
    return f"${value:.4f}" if value >= 0.01 or value == 0 else f"${value:.6f}"


def _facts(rows: Sequence[tuple[str, Markup | str | None]]) -> Markup:
    return tag("dl", [[tag("dt", k), tag("dd", v if v is not None else "—")] for k, v in rows],
               class_="facts")


def _outcome_rows(outcome: Outcome | None) -> list[tuple[str, Markup | str | None]]:
    if outcome is None:
        return [("outcome", "not recorded")]
    return [
        ("stop reason", outcome.stop_reason),
        ("usage", _usage_text(outcome.usage)),
        ("latency", f"{outcome.latency_ms:.1f} ms" if outcome.latency_ms is not None else None),
        ("cost", money(outcome.cost_usd) if outcome.cost_usd is not None else None),
        ("error", tag("code", compact(outcome.error)) if outcome.error else None),
    ]


def _ranges_text(ranges: Sequence[tuple[int, int]]) -> str:
    return ", ".join(f"#{a + 1} to #{b}" if b - a > 1 else f"#{b}"
                     for a, b in ranges if b > a) or "none"


def lineage_text(call: Call) -> str | None:
    """Why a call was made and what stands for what: a compaction call, a fallback, a call
    that sends a summary (the call numbers are the viewer's 1-based ones)."""
    lineage = call.lineage
    if lineage is None:
        return None
    parts = []
    if lineage.reason == "compaction":
        parts.append(f"compaction: summary of log messages {_ranges_text(lineage.replaces)}")
    elif lineage.reason is not None:
        parts.append(lineage.reason)
    if lineage.after is not None:
        parts.append(f"after call {lineage.after + 1} failed")
    if lineage.summary is not None:
        parts.append(f"sends the summary of call {lineage.summary + 1} in place of log "
                     f"messages {_ranges_text(lineage.replaces)}")
    return "; ".join(parts) or None


def _window_text(replay: Replay, call: Call) -> str:
    if call.window is None:
        return "not recorded"
    ranges = ", ".join(f"#{a + 1} to #{b}" if b - a > 1 else f"#{b}"
                       for a, b in call.window if b > a) or "none"
    extra = f" plus {len(call.injected)} injected" if call.injected else ""
    return f"log messages {ranges}{extra}"


def _answer_view(outcome: Outcome | None) -> Markup | None:
    """A compaction call's summary: its answer lives in its outcome, not in the messages."""
    if outcome is None or outcome.answer is None:
        return None
    return join([tag("h4", "Summary written"),
                 tag("pre", message_text(outcome.answer.get("content")) or "", class_="prompt")])


def _sent_views(replay: Replay, call: Call, where: Where | None) -> Markup:
    if call.window is None:
        return tag("p", "The messages of this call were not recorded.", class_="muted")
    indices: list[int | None] = [i for a, b in call.window for i in range(a, b)]
    for item in sorted(call.injected, key=lambda i: i.position):
        indices.insert(item.position, None)
    sent = replay.sent(call)
    views = []
    for index, message in zip(indices, sent, strict=True):
        ts = None if index is None else replay.messages.entry(index).get("ts")
        views.append(message_view(message, index=index, ts=ts if isinstance(ts, str) else None,
                                  note="injected" if index is None else None, where=where))
    return join(views)


def _tools_view(replay: Replay, call: Call) -> Markup:
    tools = replay.tools_of(call)
    if tools is None:
        text = "not recorded" if call.tools_fingerprint else "none sent"
        return tag("p", text, class_="muted")
    items = []
    for schema in tools:
        description = schema.get("description")
        items.append(tag("li", tag(
            "details",
            tag("summary", tag("code", str(schema.get("name", "?"))),
                tag("span", f" — {description}", class_="muted") if description else None),
            tag("pre", pretty(schema), class_="json"),
        )))
    return tag("ul", items, class_="tools")


def request_view(replay: Replay, call: Call, where: Where | None = None) -> Markup:
    """Everything the provider received for ``call``, verbatim, and what came back."""
    prompt = call.prompt
    if prompt is None:
        system: Markup = tag("p", call.prompt_notice or "not recorded", class_="notice")
    elif prompt.text is None:
        system = tag("p", "The prompt text could not be rebuilt (see problems).", class_="notice")
    else:
        system = tag("pre", replay.system_text(call), class_="prompt")
    prompt_fact: Markup | str | None = None
    if prompt is not None:
        prompt_fact = join([f"v{prompt.number} ", tag("code", prompt.fingerprint),
                            f" ({prompt.reason or 'no reason'})"])
    tools = replay.tools_of(call)
    sent_count = len(replay.sent(call)) if call.window is not None else 0
    return tag(
        "div",
        _facts([
            ("provider", call.provider), ("model", call.model),
            ("params", tag("code", compact(call.params)) if call.params is not None else None),
            ("prompt", prompt_fact), ("window", _window_text(replay, call)),
            *_outcome_rows(replay.outcome_of(call)),
            ("lineage", lineage_text(call)),
        ]),
        _answer_view(replay.outcome_of(call)),
        tag("h4", "System prompt"), system,
        tag("details", tag("summary", f"Messages sent ({sent_count})"),
            _sent_views(replay, call, where), class_="sent", open=True),
        tag("details", tag("summary", f"Tools ({len(tools) if tools is not None else 0})"),
            _tools_view(replay, call), class_="tools-box"),
        class_="request",
    )
