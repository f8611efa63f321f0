"""The sessions list: filters, pagination and its page. Filtering is pure and tested alone."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from app.admin import urls
from app.admin.auth import ALL_TENANTS
from app.admin.markup import Markup, join, tag
from app.admin.pages import Frame, layout
from sessions.order import newest_first
from sessions.store import SessionInfo

PER_PAGE = 50
PREVIEW_CHARS = 90


@dataclass(frozen=True, slots=True)
class ListQuery:
    """The list page's filters: ``channel`` exact, ``text`` a case-insensitive substring."""

    tenant: str
    home: str
    channel: str = ""
    text: str = ""
    page: int = 1
    can_switch: bool = False

    def url(self, **changes: str | int) -> str:
        values: dict[str, str | int | None] = {
            "tenant": None if self.tenant == self.home else self.tenant,
            "channel": self.channel, "q": self.text,
            "page": self.page if self.page != 1 else None,
        }
        values.update(changes)
        if values.get("page") == 1:
            values["page"] = None
        return urls.index(**values)


def matches(info: SessionInfo, query: ListQuery) -> bool:
    if query.channel and info.channel != query.channel:
        return False
    if query.text:
        needle = query.text.casefold()
        haystack = (info.session_id, info.conversation or "", info.first_user_text or "")
        return any(needle in field.casefold() for field in haystack)
    return True


def select(infos: Sequence[SessionInfo], query: ListQuery,
           per_page: int = PER_PAGE) -> tuple[list[SessionInfo], int, int]:
    """This page's rows, the number of matches and the number of pages (newest first)."""
    hits = newest_first(i for i in infos if matches(i, query))
    pages = max(1, math.ceil(len(hits) / per_page))
    start = (query.page - 1) * per_page
    return hits[start:start + per_page], len(hits), pages


def _preview(text: str | None) -> str:
    if not text:
        return ""
    flat = " ".join(text.split())
    return flat if len(flat) <= PREVIEW_CHARS else flat[: PREVIEW_CHARS - 1] + "…"


def _filters(query: ListQuery, channels: Sequence[str]) -> Markup:
    options = [tag("option", "any channel", value="")]
    options += [tag("option", c, value=c, selected=c == query.channel) for c in channels]
    fields: list[Markup] = [
        tag("label", "Search ", tag("input", type="search", name="q", value=query.text,
                                    placeholder="id, conversation or first message")),
        tag("label", "Channel ", tag("select", options, name="channel")),
    ]
    if query.can_switch:
        fields.append(tag("label", "Tenant ", tag(
            "input", type="text", name="tenant", size=14,
            value="" if query.tenant == query.home else query.tenant,
            placeholder=f"{query.home} (or * for all)")))
    elif query.tenant != query.home:
        fields.append(tag("input", type="hidden", name="tenant", value=query.tenant))
    fields.append(tag("button", "Filter", type="submit"))
    return tag("form", fields, method="get", action=urls.index(), class_="filters")


def _row(info: SessionInfo, query: ListQuery) -> Markup:
    flags = []
    if info.torn:
        flags.append(tag("span", "torn tail", class_="badge warn"))
    if info.error:
        flags.append(tag("span", info.error, class_="badge bad"))
    if info.scheduled:
        flags.append(tag("span", f"{info.scheduled} scheduled", class_="badge scheduled"))
    cells = [
        tag("td", tag("a", info.session_id,
                      href=urls.session(info.session_id, info.tenant, query.home))),
        tag("td", info.started_at or "—", class_="ts"),
        tag("td", info.channel or "—"),
        tag("td", info.conversation or "—"),
    ]
    if query.tenant == ALL_TENANTS:
        cells.append(tag("td", info.tenant))
    cells += [tag("td", str(info.message_count), class_="num"),
              tag("td", _preview(info.first_user_text), " " if flags else None, flags,
                  class_="preview")]
    return tag("tr", cells)


def _pager(query: ListQuery, pages: int) -> Markup:
    links: list[Markup | str] = []
    if query.page > 1:
        links.append(tag("a", "← newer", href=query.url(page=query.page - 1), rel="prev"))
    links.append(tag("span", f"page {query.page} of {pages}"))
    if query.page < pages:
        links.append(tag("a", "older →", href=query.url(page=query.page + 1), rel="next"))
    return tag("nav", join(links, " "), class_="pager")


def list_page(query: ListQuery, infos: Sequence[SessionInfo], frame: Frame) -> Markup:
    """The whole sessions page for ``infos`` (every session of the tenant(s) in view)."""
    channels = sorted({i.channel for i in infos if i.channel})
    rows, total, pages = select(infos, query)
    heads = ["session", "started", "channel", "conversation"]
    if query.tenant == ALL_TENANTS:
        heads.append("tenant")
    heads += ["messages", "first user message"]
    if rows:
        table: Markup = tag("table", tag("thead", tag("tr", [tag("th", h) for h in heads])),
                            tag("tbody", [_row(i, query) for i in rows]), class_="sessions")
    else:
        table = tag("p", "No sessions match." if infos else "No sessions yet.", class_="muted")
    summary = f"{total} session{'s' if total != 1 else ''}"
    if total != len(infos):
        summary += f" of {len(infos)}"
    body = join([tag("h1", "Sessions"), _filters(query, channels),
                 tag("p", summary, class_="muted", id="count"), table, _pager(query, pages)])
    return layout("Sessions", body, frame)
