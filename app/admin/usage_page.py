"""The usage page: what the calls of the last days cost, per day (a bar chart) and per session.

Built from :mod:`sessions.usage` rows (costs as recorded at call time; calls recorded without
one priced with the table in force). Rendered on the server as inline SVG, like the drift chart.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, timedelta

from app.admin import urls
from app.admin.chart import nice_ceiling
from app.admin.markup import Markup, join, tag
from app.admin.pages import Frame, layout
from app.admin.render import money
from sessions.usage import UsageRow, total

WIDTH, HEIGHT = 760, 240
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 16, 40
TOP_SESSIONS = 50


def days_of(rows: Sequence[UsageRow], last: date, days: int) -> list[UsageRow]:
    """One row per day of the ``days`` days ending ``last`` (empty days as zero rows)."""
    found = {r.key: r for r in rows}
    first = last - timedelta(days=days - 1)
    return [found.get(d.isoformat(), UsageRow(d.isoformat()))
            for d in (first + timedelta(days=n) for n in range(days))]


def daily_chart(days: Sequence[UsageRow]) -> Markup:
    """Bars of each day's cost, with the day's tokens and calls in each bar's tooltip."""
    ymax = nice_ceiling(max((d.cost_usd for d in days), default=0.0) * 100) / 100
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_w / max(1, len(days))
    parts: list[Markup] = []
    for i in range(5):
        value = ymax * i / 4
        y = TOP + plot_h - value / ymax * plot_h
        parts.append(tag("line", x1=LEFT, x2=LEFT + plot_w, y1=f"{y:.1f}", y2=f"{y:.1f}",
                         class_="grid"))
        parts.append(tag("text", f"${value:g}", x=LEFT - 6, y=f"{y + 4:.1f}",
                         text_anchor="end", class_="tick"))
    every = max(1, len(days) // 10)
    for n, day in enumerate(days):
        height = day.cost_usd / ymax * plot_h
        x = LEFT + n * step
        parts.append(tag(
            "rect", tag("title", f"{day.key}: {money(day.cost_usd)}, {day.calls} calls, "
                                 f"{day.tokens:,} tokens ({day.cache_read:,} read from cache)"),
            x=f"{x + step * 0.15:.1f}", y=f"{TOP + plot_h - height:.1f}",
            width=f"{step * 0.7:.1f}", height=f"{height:.1f}", class_="bar",
            data_day=day.key))
        if n % every == 0 or n == len(days) - 1:
            parts.append(tag("text", day.key[5:], x=f"{x + step / 2:.1f}", y=TOP + plot_h + 16,
                             text_anchor="middle", class_="tick"))
    parts.append(tag("line", x1=LEFT, x2=LEFT + plot_w, y1=TOP + plot_h, y2=TOP + plot_h,
                     class_="axis"))
    return tag("svg", tag("title", "Cost per day"), join(parts),
               xmlns="http://www.w3.org/2000/svg", viewBox=f"0 0 {WIDTH} {HEIGHT}",
               width=WIDTH, height=HEIGHT, role="img", class_="usage-chart",
               aria_label="Cost per day in US dollars")


def _numbers(row: UsageRow) -> list[Markup]:
    cost = money(row.cost_usd) + (f" (+{row.unpriced} unpriced)" if row.unpriced else "")
    return [tag("td", str(row.calls), class_="num"), tag("td", f"{row.input_total:,}",
                                                          class_="num"),
            tag("td", f"{row.cache_read:,}", class_="num"),
            tag("td", f"{row.output_tokens:,}", class_="num"), tag("td", cost, class_="num")]


_HEADS = ["calls", "input tokens", "of which cached", "output tokens", "cost"]


def usage_page(days: Sequence[UsageRow], sessions: Sequence[UsageRow], span: int,
               home: str, frame: Frame) -> Markup:
    """The page: the chart, the days as a table, the costliest sessions with links."""
    spent = total(days)
    day_rows = [tag("tr", tag("td", d.key), _numbers(d)) for d in reversed(days) if d.calls]
    session_rows = []
    for row in sessions[:TOP_SESSIONS]:
        tenant, session_id = row.key.split("/", 1)
        session_rows.append(tag("tr", tag("td", tag("a", session_id,
                                                     href=urls.session(session_id, tenant, home))),
                                tag("td", tenant), _numbers(row)))
    table_days = tag("table", tag("thead", tag("tr", [tag("th", h) for h in ["day", *_HEADS]])),
                     tag("tbody", day_rows), class_="data")
    table_sessions = tag("table", tag("thead", tag("tr", [tag("th", h) for h in [
        "session", "tenant", *_HEADS]])), tag("tbody", session_rows), class_="data sessions-cost")
    body = join([
        tag("h1", "Usage"),
        tag("p", f"Last {span} days: {money(spent.cost_usd)} for {spent.calls} calls, "
                 f"{spent.tokens:,} tokens.", class_="muted", id="usage-total"),
        daily_chart(days),
        tag("section", tag("h2", "Per day"), table_days if day_rows else
            tag("p", "No calls in these days.", class_="muted")),
        tag("section", tag("h2", "Costliest sessions"), table_sessions if session_rows else
            tag("p", "No calls in these days.", class_="muted"), id="sessions-cost"),
    ])
    return layout("Usage", body, frame)
