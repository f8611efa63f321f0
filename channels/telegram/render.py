"""Render the model's Markdown into Telegram Bot API HTML chunks (pure, no I/O).

Parsing and split points come from :mod:`channels.markdown`; this module renders each chunk
as Telegram HTML. Telegram rules followed here (Bot API "Formatting options", parse_mode=HTML):

* tags are limited to ``b i s code pre a blockquote`` (``u`` is allowed but Markdown
  has no underline); only ``&``, ``<``, ``>`` are escaped in text (plus ``"``
  inside attribute values);
* the 4096 limit applies to the text *after* entity parsing, in UTF-16 code units,
  so chunks are measured with :func:`utf16_len` on their visible text;
* ``pre``/``code`` cannot contain other entities and b/i/s cannot wrap them, so
  inline styles are dropped on code; ``a`` and ``code`` cannot nest, so code
  styling is dropped inside links; blockquotes are never nested;
* only ``http``, ``https`` and ``tg`` links become ``<a>`` (Telegram rejects other
  schemes); other links keep their text only.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Final

from channels.markdown import (
    MIN_FILL,
    TELEGRAM_LIMIT,
    Document,
    Mark,
    MarkKind,
    Span,
    parse_document,
    split_ranges,
)

_STYLE_KINDS: Final = frozenset({"bold", "italic", "strike"})
_TELEGRAM_SCHEMES: Final = frozenset({"http", "https", "tg"})

__all__ = [
    "MIN_FILL",
    "TELEGRAM_LIMIT",
    "Document",
    "Mark",
    "MarkKind",
    "Span",
    "TelegramChunk",
    "parse_document",
    "render_chunks",
    "split_ranges",
    "utf16_len",
    "visible_len",
    "visible_text",
]

# --------------------------------------------------------------------------- telegram


@dataclass(frozen=True, slots=True)
class TelegramChunk:
    """One message: ``html`` for parse_mode=HTML, ``plain`` as the no-parse-mode fallback."""

    html: str
    plain: str


def utf16_len(text: str) -> int:
    """Length of ``text`` in UTF-16 code units (astral characters count as two)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


class _TextCollector(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def visible_text(html: str) -> str:
    """The text Telegram shows for an HTML message: tags removed, entities decoded."""
    collector = _TextCollector()
    collector.feed(html)
    collector.close()
    return "".join(collector.parts)


def visible_len(html: str) -> int:
    """Visible length of a Telegram HTML string in UTF-16 code units."""
    return utf16_len(visible_text(html))


def render_chunks(markdown: str, limit: int = TELEGRAM_LIMIT) -> list[TelegramChunk]:
    """Render Markdown to Telegram HTML chunks whose visible text is at most ``limit``.

    ``limit`` is in UTF-16 code units and must be at least 2 (one astral character).
    """
    if limit < 2:
        raise ValueError("limit must be at least 2 UTF-16 code units")
    doc = parse_document(markdown)
    units = tuple(itertools.accumulate((2 if ord(c) > 0xFFFF else 1 for c in doc.text), initial=0))

    def fits(start: int, end: int) -> bool:
        return units[end] - units[start] <= limit

    return [
        TelegramChunk(html=_to_html(doc.slice(a, b)), plain=doc.text[a:b])
        for a, b in split_ranges(doc, fits, limit)
    ]


def _to_html(spans: Iterable[Span]) -> str:
    """Render spans as balanced HTML: only the differing tail of the tag stack changes."""
    out: list[str] = []
    stack: tuple[Mark, ...] = ()
    for span in spans:
        marks = _telegram_marks(span.marks)
        keep = 0
        while keep < min(len(stack), len(marks)) and stack[keep] == marks[keep]:
            keep += 1
        out.extend(_close_tag(m) for m in reversed(stack[keep:]))
        out.extend(_open_tag(m) for m in marks[keep:])
        stack = marks
        out.append(_escape(span.text))
    out.extend(_close_tag(m) for m in reversed(stack))
    return "".join(out)


def _telegram_marks(marks: tuple[Mark, ...]) -> tuple[Mark, ...]:
    """Apply Telegram's entity nesting rules (see module docstring)."""
    link = any(m.kind == "link" and _link_ok(m.attr) for m in marks)
    pre = any(m.kind == "pre" for m in marks)
    code = not link and not pre and any(m.kind == "code" for m in marks)
    kept: list[Mark] = []
    for mark in marks:
        if mark.kind == "link" and not link:
            continue
        if mark.kind == "code" and not code:
            continue
        if mark.kind in _STYLE_KINDS and (pre or code):
            continue
        kept.append(mark)
    return tuple(kept)


def _link_ok(href: str) -> bool:
    scheme, sep, _ = href.partition(":")
    return bool(sep) and scheme.lower() in _TELEGRAM_SCHEMES


_OPEN: Final = {
    "bold": "<b>",
    "italic": "<i>",
    "strike": "<s>",
    "code": "<code>",
    "quote": "<blockquote>",
}
_CLOSE: Final = {
    "bold": "</b>",
    "italic": "</i>",
    "strike": "</s>",
    "code": "</code>",
    "quote": "</blockquote>",
    "link": "</a>",
}


def _open_tag(mark: Mark) -> str:
    if mark.kind == "link":
        return f'<a href="{_escape(mark.attr, quote=True)}">'
    if mark.kind == "pre":
        return f'<pre><code class="language-{mark.attr}">' if mark.attr else "<pre>"
    return _OPEN[mark.kind]


def _close_tag(mark: Mark) -> str:
    if mark.kind == "pre":
        return "</code></pre>" if mark.attr else "</pre>"
    return _CLOSE[mark.kind]


def _escape(text: str, *, quote: bool = False) -> str:
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace('"', "&quot;") if quote else text
