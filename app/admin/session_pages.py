"""The session page, the page of one provider call, and the prompt diff page.

Per-call details are rendered inline in the session page while the page stays under
``inline_budget`` characters (estimated from prompt sizes and window lengths); past that each
call's ``<details>`` holds a link to its own page, which the page script loads when opened, so a
long session costs O(log size) to show instead of O(calls x window).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.admin import urls
from app.admin.attachments import elided
from app.admin.chart import drift_chart, drift_table
from app.admin.diff import SectionDiff, diff_versions
from app.admin.markup import Markup, join, tag
from app.admin.pages import Frame, layout
from app.admin.render import (
    Where,
    call_summary,
    message_view,
    money,
    notice_marker,
    pretty,
    prompt_marker,
    request_view,
)
from sessions.cache_bust import CacheBust, cache_busts
from sessions.drift import METRICS, DriftPoint
from sessions.pricing import PriceTable
from sessions.replay import Call, NotRebuildableError, PromptVersion, Replay
from sessions.usage import UsageRow, aggregate, calls_of, total

INLINE_BUDGET = 2_000_000


@dataclass(frozen=True, slots=True)
class SessionView:
    """A replayed session and what the page needs around it: ``busts`` are its cache-busting
    changes by call number, ``prices`` the table for calls recorded without a cost."""

    replay: Replay
    where: Where
    size: int
    frame: Frame
    busts: Mapping[int, CacheBust] = field(default_factory=dict)
    prices: PriceTable = field(default_factory=PriceTable)

    @classmethod
    def of(cls, replay: Replay, where: Where, size: int, frame: Frame,
           prices: PriceTable | None = None) -> SessionView:
        """The view with its cache-busting changes found (a pass over the calls)."""
        return cls(replay, where, size, frame, {b.call: b for b in cache_busts(replay)},
                   prices or PriceTable())


# -- session page ------------------------------------------------------------------------------


def _usage_totals(replay: Replay) -> dict[str, float]:
    totals: dict[str, float] = {}
    for outcome in replay.outcomes.values():
        for key, value in (outcome.usage or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                totals[key] = totals.get(key, 0) + value
    return totals


def _header(view: SessionView) -> Markup:
    replay = view.replay
    h: Mapping[str, Any] = replay.header
    outcomes = list(replay.outcomes.values())
    latency = sum(o.latency_ms or 0.0 for o in outcomes)
    errors = sum(1 for o in outcomes if o.error)
    models = sorted({t.model for t in replay.calls if t.model})
    usage = ", ".join(f"{k} {v:g}" for k, v in _usage_totals(replay).items())
    spent = total(aggregate(calls_of(replay, view.prices), "tenant"))
    rows: list[tuple[str, str]] = [
        ("tenant", str(h.get("tenant") or view.where.tenant)),
        ("channel", str(h.get("channel") or "—")),
        ("conversation", str(h.get("conversation") or "—")),
        ("started", str(h.get("startedAt") or "—")),
        ("format", f"v{replay.version}"),
        ("messages", str(len(replay.messages))),
        ("provider calls", f"{len(replay.calls)}" + (f" ({errors} failed)" if errors else "")),
        ("prompt versions", str(len(replay.prompts))),
        ("models", ", ".join(models) or "—"),
        ("usage", usage or "—"),
        ("cost", _cost_text(spent) if spent.calls else "—"),
        ("cache", _cache_text(spent) if spent.input_total else "—"),
        ("provider time", f"{latency / 1000:.2f} s" if outcomes else "—"),
        ("log size", f"{view.size:,} bytes"),
    ]
    return tag("dl", [[tag("dt", k), tag("dd", v)] for k, v in rows], class_="facts header")


def _cost_text(spent: UsageRow) -> str:
    text = money(spent.cost_usd)
    if spent.unpriced:
        text += f" (+{spent.unpriced} call(s) of a model without a price)"
    return text


def _cache_text(spent: UsageRow) -> str:
    share = spent.cache_read / spent.input_total
    return (f"{spent.cache_read:,} input tokens read from the cache ({share:.0%} of input), "
            f"{spent.cache_write:,} written")


def notices(replay: Replay) -> Markup:
    """The session page's notices (torn tail, limits that refused, ...): public, so the
    tests check what the page says of a replay without rendering a whole page."""
    items: list[Markup] = []
    if replay.notice:
        items.append(tag("li", tag("strong", "Notice: "), replay.notice))
    if replay.torn_tail:
        items.append(tag("li", tag("strong", "Torn tail: "),
                         "the last line was cut by an interrupted write and was skipped."))
    for version in replay.prompts:
        if not version.verified:
            items.append(tag("li", tag("strong", f"Prompt v{version.number}: "),
                             "its text could not be rebuilt to match its fingerprint."))
    for problem in replay.problems:
        items.append(tag("li", tag("strong", f"Line {problem.line}: "), problem.message))
    for gap in replay.gaps:
        items.append(tag("li", tag("strong", f"Line {gap.line}: "),
                         f"the log refused {len(gap.refused)} entr"
                         f"{'y' if len(gap.refused) == 1 else 'ies'} ({gap.kind} at "
                         f"{gap.at or '?'}); calls it held are marked not recorded."))
    for r in replay.refusals:
        items.append(tag("li", tag("strong", f"Refused at {r.ts or '?'}: "),
                         f"message {r.after} got the {r.limit} limit's notice (until "
                         f"{r.until or '?'}); no provider call was made."))
    for reply in replay.replies:
        what = "an apology" if reply.kind == "apology" else f"a {reply.kind}"
        items.append(tag("li", tag("strong", f"Replied at {reply.ts or '?'}: "),
                         f"message {'?' if reply.message is None else reply.message} got "
                         f"{what} ({reply.text!r}); no model answer."))
    if not items:
        return Markup("")
    return tag("section", tag("h2", "Replay notices and problems"), tag("ul", items),
               class_="problems", id="problems")


def _version_options(replay: Replay, chosen: int) -> list[Markup]:
    return [tag("option", f"v{v.number} — {v.reason or 'no reason'}", value=v.number,
                selected=v.number == chosen) for v in replay.prompts]


def diff_form(view: SessionView, a: int, b: int) -> Markup:
    where = view.where
    hidden = tag("input", type="hidden", name="tenant", value=where.tenant) \
        if where.tenant != where.home else None
    return tag(
        "form",
        tag("label", "from ", tag("select", _version_options(view.replay, a), name="a")),
        tag("label", " to ", tag("select", _version_options(view.replay, b), name="b")),
        hidden, " ", tag("button", "Compare", type="submit"),
        method="get", action=urls.session(where.session_id, where.tenant, where.home, "/diff"),
        class_="diff-form",
    )


def _timeline(view: SessionView) -> Markup:
    replay = view.replay
    if not replay.prompts:
        return tag("section", tag("h2", "Prompt versions"),
                   tag("p", replay.notice or "No prompt was recorded.", class_="muted"))
    rows = [
        tag("tr",
            tag("td", tag("a", f"v{v.number}", href=f"#prompt-v{v.number}")),
            tag("td", v.ts or "—", class_="ts"), tag("td", v.reason or "—", class_="reason"),
            tag("td", tag("code", v.fingerprint)),
            tag("td", ", ".join(s.name for s in v.sections)),
            tag("td", str(v.first_call) if v.first_call is not None else "never used"),
            tag("td", "yes" if v.verified else tag("span", "no", class_="badge warn")))
        for v in replay.prompts
    ]
    heads = ["version", "recorded", "reason", "fingerprint", "sections", "first call", "verified"]
    table = tag("table", tag("thead", tag("tr", [tag("th", h) for h in heads])),
                tag("tbody", rows), class_="data")
    n = len(replay.prompts)
    return tag("section", tag("h2", "Prompt versions"), table,
               diff_form(view, max(1, n - 1), n), id="versions")


def _drift(view: SessionView, points: list[DriftPoint], metric: str) -> Markup:
    where = view.where
    options = [tag("option", name, value=name, selected=name == metric) for name in METRICS]
    hidden = tag("input", type="hidden", name="tenant", value=where.tenant) \
        if where.tenant != where.home else None
    form = tag("form", tag("label", "metric ", tag("select", options, name="metric")), hidden,
               " ", tag("button", "Redraw", type="submit"), method="get",
               action=urls.session(where.session_id, where.tenant, where.home) + "#drift",
               class_="metric-form")
    table = tag("details", tag("summary", "Drift data"), drift_table(points)) if points else None
    return tag("section", tag("h2", "Prompt drift"), form, drift_chart(points, metric), table,
               id="drift")


def _inline_cost(view: SessionView) -> int:
    """Rough size of every call's details: prompt texts plus windows at the mean message size."""
    replay = view.replay
    per_message = view.size // max(1, len(replay.messages))
    cost = 0
    for call in replay.calls:
        cost += len(call.prompt.text or "") if call.prompt else 0
        cost += sum(b - a for a, b in call.window or ()) * per_message
    return cost


def _call_block(view: SessionView, call: Call, inline: bool) -> Markup:
    where = view.where
    if inline:
        body = request_view(view.replay, call, where)
    else:
        link = urls.call(where.session_id, where.tenant, where.home, call.index)
        body = tag("div", tag("a", f"Open the request of call {call.index}", href=link),
                   class_="lazy",
                   data_src=urls.call(where.session_id, where.tenant, where.home, call.index,
                                      fragment=True))
    return tag("details", tag("summary", call_summary(view.replay, call,
                                                     view.busts.get(call.index))), body,
               class_="call", id=f"call-{call.index}")


def _position(replay: Replay, call: Call) -> int:
    """Where a call goes in the conversation: before its answer, else after what it saw."""
    if call.assistant is not None:
        return call.assistant
    if call.window:
        return max(b for _, b in call.window)
    return len(replay.messages)


def conversation(view: SessionView, inline: bool) -> Markup:
    """Messages in log order; before each answer, its call, and a marker if the prompt changed."""
    replay = view.replay
    at: dict[int, list[Call]] = {}
    for call in replay.calls:
        at.setdefault(_position(replay, call), []).append(call)
    out: list[Markup] = []
    shown: str | None = None  # fingerprint or notice of the prompt last shown
    for index in range(len(replay.messages) + 1):
        for call in at.get(index, ()):
            if call.prompt is not None and call.prompt.fingerprint != shown:
                out.append(prompt_marker(call.prompt, view.where, first=shown is None))
                shown = call.prompt.fingerprint
            elif call.prompt is None and call.prompt_notice and call.prompt_notice != shown:
                out.append(notice_marker(call.prompt_notice))
                shown = call.prompt_notice
            out.append(_call_block(view, call, inline))
        if index < len(replay.messages):
            entry = replay.messages.entry(index)
            ts = entry.get("ts")
            meta = entry.get("meta")
            out.append(message_view(entry["message"], index=index,
                                    ts=ts if isinstance(ts, str) else None, where=view.where,
                                    meta=meta if isinstance(meta, dict) else None))
    if not out:
        return tag("p", "This session has no messages.", class_="muted")
    return join(out)


def session_page(view: SessionView, points: list[DriftPoint], metric: str,
                 inline_budget: int = INLINE_BUDGET) -> Markup:
    replay = view.replay
    inline = _inline_cost(view) <= inline_budget
    toggle = tag("button", "Expand all calls", type="button", class_="link",
                 data_action="toggle-calls")
    body = join([
        tag("h1", "Session ", tag("code", replay.session_id or view.where.session_id)),
        _header(view), notices(replay), _timeline(view), _drift(view, points, metric),
        tag("section", tag("h2", "Conversation ", toggle), conversation(view, inline),
            id="conversation", class_="conversation"),
    ])
    return layout(f"Session {view.where.session_id}", body, view.frame)


# -- one call ----------------------------------------------------------------------------------


def call_page(view: SessionView, call: Call, blobs: Mapping[str, bytes] | None = None,
              refused: str | None = None) -> Markup:
    """One call; ``blobs``: the bytes of its attachments, to rebuild its body exactly (shown
    with the base64 elided); ``refused``: why they could not be had (a damaged blob)."""
    where = view.where
    replay = view.replay
    back = urls.session(where.session_id, where.tenant, where.home) + f"#call-{call.index}"
    body = join([
        tag("p", tag("a", f"← session {where.session_id}", href=back)),
        tag("h1", f"Call {call.index}"),
        tag("p", call_summary(replay, call, view.busts.get(call.index))),
        request_view(replay, call, where),
        _request_body(replay, call, blobs, refused),
        tag("h4", "Answer"),
        message_view(replay.messages[call.assistant], index=call.assistant, where=where)
        if call.assistant is not None else tag("p", "No answer was recorded.", class_="muted"),
    ])
    return layout(f"Call {call.index} of {where.session_id}", body, view.frame)


def _request_body(replay: Replay, call: Call, blobs: Mapping[str, bytes] | None,
                  refused: str | None = None) -> Markup:
    if not call.rebuildable:
        return tag("p", f"No request body: this call was {call.status_text}.",
                   class_="notice bad")
    if refused is not None:
        return tag("p", f"No request body: {refused}.", class_="notice bad")
    try:
        body = replay.request(call, blobs=blobs)
    except NotRebuildableError as exc:  # a blob the store does not hold (named in the message)
        return tag("p", f"No request body: {exc}.", class_="notice bad")
    summary = "Request body as rebuilt by replay (JSON)"
    if replay.attachments(call):
        summary += ", attachment bytes elided"
    return tag("details", tag("summary", summary), tag("pre", pretty(elided(body)),
                                                       class_="json"))


# -- diff --------------------------------------------------------------------------------------


def _diff_lines(item: SectionDiff) -> Markup:
    spans = []
    for line in item.lines:
        if line.kind == "skip":
            spans.append(tag("span", f"… {line.count} unchanged lines …\n", class_="skip"))
        else:
            mark = {"same": " ", "add": "+", "del": "-"}[line.kind]
            spans.append(tag("span", f"{mark} {line.text}\n", class_=line.kind))
    return tag("pre", spans, class_="diff")


def _section_diff(item: SectionDiff, new: PromptVersion) -> Markup:
    counts = f" +{item.added} -{item.removed}" if item.status == "changed" else ""
    head = tag("h3", tag("code", item.name), " ", tag("span", item.status, class_="status"),
               tag("span", counts, class_="muted"))
    if item.status == "unchanged":
        text = next((s.text for s in new.sections if s.name == item.name), None)
        body: Markup | None = tag("details", tag("summary", "show text"),
                                  tag("pre", text or "", class_="prompt"))
    elif not item.available:
        body = tag("p", "The section text is not in the log; only its hash changed.",
                   class_="notice")
    else:
        body = _diff_lines(item)
    return tag("section", head, body, class_=f"sdiff {item.status}",
               data_section=item.name, data_status=item.status)


def diff_page(view: SessionView, old: PromptVersion, new: PromptVersion) -> Markup:
    where = view.where
    items = diff_versions(old, new)
    counts: dict[str, int] = {}
    for item in items:
        counts[item.status] = counts.get(item.status, 0) + 1
    summary = ", ".join(f"{n} {status}" for status, n in counts.items()) or "no sections"
    body = join([
        tag("p", tag("a", f"← session {where.session_id}",
                     href=urls.session(where.session_id, where.tenant, where.home))),
        tag("h1", f"Prompt v{old.number} → v{new.number}"),
        tag("p", tag("span", old.reason or "no reason", class_="reason"), " → ",
            tag("span", new.reason or "no reason", class_="reason"), f" · {summary}"),
        diff_form(view, old.number, new.number),
        join(_section_diff(item, new) for item in items),
    ])
    return layout(f"Diff v{old.number} to v{new.number}", body, view.frame)
