"""The drift chart: cumulative drift of each prompt section over prompt versions, as inline SVG.

Rendered on the server from :func:`sessions.drift.drift` points, so it needs no script and no
chart library. Colours come from CSS classes (``s0`` .. ``s7``, reused past eight sections);
section names are untrusted text and go through the escaping builder like everything else.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from app.admin.markup import Markup, join, tag
from sessions.drift import DriftPoint

WIDTH, HEIGHT = 760, 300
LEFT, RIGHT, TOP, BOTTOM = 56, 190, 20, 48
PALETTE_SIZE = 8
LEGEND_CHARS = 22


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is >= ``value`` (at least 1)."""
    if value <= 1:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * power >= value:
            return float(step * power)
    return float(10 * power)  # pragma: no cover - the loop always returns


def _fmt(value: float) -> str:
    return f"{value:g}"


def series_of(points: Sequence[DriftPoint]) -> dict[str, list[DriftPoint]]:
    """Points grouped by section, in the order sections first appear."""
    out: dict[str, list[DriftPoint]] = {}
    for point in points:
        out.setdefault(point.section, []).append(point)
    return out


def drift_chart(points: Sequence[DriftPoint], metric: str) -> Markup:
    """An ``<svg>`` line chart of ``cumulative`` per section, with axes and a legend."""
    if not points:
        return tag("p", "No prompt versions in this session: nothing to chart.", class_="muted")
    versions = sorted({p.version for p in points})
    lo, hi = versions[0], versions[-1]
    ymax = nice_ceiling(max(p.cumulative for p in points))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(version: int) -> float:
        if hi == lo:
            return LEFT + plot_w / 2
        return LEFT + (version - lo) / (hi - lo) * plot_w

    def y(value: float) -> float:
        return TOP + plot_h - value / ymax * plot_h

    grid: list[Markup] = []
    for i in range(5):
        value = ymax * i / 4
        grid.append(tag("line", x1=LEFT, x2=LEFT + plot_w, y1=f"{y(value):.1f}",
                        y2=f"{y(value):.1f}", class_="grid"))
        grid.append(tag("text", _fmt(value), x=LEFT - 6, y=f"{y(value) + 4:.1f}",
                        text_anchor="end", class_="tick"))
    every = max(1, math.ceil(len(versions) / 12))
    for n, version in enumerate(versions):
        if n % every and version != hi:
            continue
        grid.append(tag("text", f"v{version}", x=f"{x(version):.1f}", y=TOP + plot_h + 16,
                        text_anchor="middle", class_="tick"))
    axes = [
        tag("line", x1=LEFT, x2=LEFT, y1=TOP, y2=TOP + plot_h, class_="axis"),
        tag("line", x1=LEFT, x2=LEFT + plot_w, y1=TOP + plot_h, y2=TOP + plot_h, class_="axis"),
        tag("text", "prompt version", x=f"{LEFT + plot_w / 2:.1f}", y=HEIGHT - 8,
            text_anchor="middle", class_="axis-label"),
        tag("text", f"cumulative drift (1 - {metric} similarity)",
            transform=f"translate(14 {TOP + plot_h / 2:.1f}) rotate(-90)",
            text_anchor="middle", class_="axis-label"),
    ]
    lines: list[Markup] = []
    legend: list[Markup] = []
    for n, (section, series) in enumerate(series_of(points).items()):
        colour = f"s{n % PALETTE_SIZE}"
        coords = " ".join(f"{x(p.version):.1f},{y(p.cumulative):.1f}" for p in series)
        dots = [
            tag("circle", tag("title", f"{section} v{p.version}: cumulative {p.cumulative:.3f}"
                                       f"{'' if p.present else ' (absent)'} — {p.reason or ''}"),
                cx=f"{x(p.version):.1f}", cy=f"{y(p.cumulative):.1f}", r=3,
                class_=f"dot {colour}" if p.present else f"dot hollow {colour}")
            for p in series
        ]
        lines.append(tag("g", tag("polyline", points=coords, class_=f"series {colour}"), dots,
                         class_="section", data_section=section))
        label = section if len(section) <= LEGEND_CHARS else section[: LEGEND_CHARS - 1] + "…"
        ly = TOP + 8 + n * 18
        legend.append(tag("g", tag("title", section),
                          tag("line", x1=WIDTH - RIGHT + 16, x2=WIDTH - RIGHT + 36, y1=ly, y2=ly,
                              class_=f"series {colour}"),
                          tag("text", label, x=WIDTH - RIGHT + 42, y=ly + 4, class_="legend-text"),
                          class_="legend-item"))
    return tag(
        "svg",
        tag("title", "Cumulative drift per prompt section"),
        join(grid), join(axes), join(lines), tag("g", legend, class_="legend"),
        xmlns="http://www.w3.org/2000/svg", viewBox=f"0 0 {WIDTH} {HEIGHT}",
        width=WIDTH, height=HEIGHT, role="img", class_="drift-chart",
        aria_label="Cumulative drift per prompt section over prompt versions",
    )


def drift_table(points: Sequence[DriftPoint]) -> Markup:
    """The chart's numbers as a table (the accessible form of the same data)."""
    head = tag("tr", [tag("th", h) for h in (
        "version", "section", "present", "bytes added", "bytes removed", "similarity to prev",
        "cumulative", "reason")])
    rows = [
        tag("tr",
            tag("td", f"v{p.version}"), tag("td", p.section),
            tag("td", "yes" if p.present else "no"),
            tag("td", f"+{p.bytes_added}", class_="num"),
            tag("td", f"-{p.bytes_removed}", class_="num"),
            tag("td", "—" if p.similarity_prev is None else f"{p.similarity_prev:.3f}",
                class_="num"),
            tag("td", f"{p.cumulative:.3f}", class_="num"), tag("td", p.reason or ""))
        for p in points
    ]
    return tag("table", tag("thead", head), tag("tbody", rows), class_="data")
