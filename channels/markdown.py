"""Markdown parsed once into a platform-neutral document, and split points for chunking.

The reply is parsed with markdown-it-py (CommonMark + tables + strikethrough) into a flat run
of :class:`Span` objects, each a piece of *visible* text plus the formatting :class:`Mark`
objects that apply to it. Platform renderers (:mod:`channels.telegram.render`,
:mod:`channels.slack.render`) chunk that visible text with :func:`split_ranges` and render
every chunk on its own from the marks of the spans it covers, so every chunk is well-formed by
construction: a code block or a bold run that crosses a split point is closed at the end of one
chunk and reopened (same language) at the start of the next. Split points, best first: between
blocks (paragraphs, list items), at a newline, at a space, mid-word (never inside a grapheme);
a better kind of split point is skipped when using it would fill less than :data:`MIN_FILL` of
the chunk.

Markdown mapping: headings -> bold line, lists -> "• " / "1. " lines, tables -> aligned text in
a preformatted block, images -> link (alt text, or the URL when alt is empty), soft line breaks
-> newlines (chat users expect the model's line breaks to stay), raw HTML -> literal text.
"""

from __future__ import annotations

import bisect
import itertools
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from markdown_it import MarkdownIt
from markdown_it.tree import SyntaxTreeNode

TELEGRAM_LIMIT: Final = 4096

# A preferred split point (block boundary, newline, space) is only taken if the chunk
# it produces is at least this fraction of what would fit; otherwise a 100-character
# intro followed by a long code block would become a tiny message of its own.
MIN_FILL: Final = 0.5

MarkKind = Literal["bold", "italic", "strike", "code", "link", "pre", "quote"]

_HR_TEXT: Final = "———"
_BULLET: Final = "• "


# --------------------------------------------------------------------------- model


@dataclass(frozen=True, slots=True)
class Mark:
    """One formatting property of a span; ``attr`` is the href (link) or language (pre)."""

    kind: MarkKind
    attr: str = ""


@dataclass(frozen=True, slots=True)
class Span:
    """Visible text with its marks, outermost first.

    ``is_break`` marks the separator between two blocks (paragraphs, list items):
    the preferred place to split, and dropped when a split happens there.
    """

    text: str
    marks: tuple[Mark, ...] = ()
    is_break: bool = False


@dataclass(frozen=True, slots=True)
class Document:
    """A parsed reply: spans, their concatenated visible text and span offsets."""

    spans: tuple[Span, ...]
    text: str
    starts: tuple[int, ...]

    @classmethod
    def from_spans(cls, spans: Iterable[Span]) -> Document:
        merged = _merge(spans)
        starts = tuple(itertools.accumulate((len(s.text) for s in merged[:-1]), initial=0))
        return cls(tuple(merged), "".join(s.text for s in merged), starts if merged else ())

    def slice(self, start: int, end: int) -> list[Span]:
        """Spans covering ``text[start:end]``, clipped to that range."""
        out: list[Span] = []
        i = max(bisect.bisect_right(self.starts, start) - 1, 0)
        while i < len(self.spans) and self.starts[i] < end:
            span, s0 = self.spans[i], self.starts[i]
            lo, hi = max(start - s0, 0), min(end - s0, len(span.text))
            if lo < hi:
                out.append(Span(span.text[lo:hi], span.marks, span.is_break))
            i += 1
        return out

    def block_breaks(self) -> list[tuple[int, int]]:
        """``(start, end)`` of every block separator, in order."""
        return [
            (s0, s0 + len(span.text))
            for span, s0 in zip(self.spans, self.starts, strict=True)
            if span.is_break
        ]


def _merge(spans: Iterable[Span]) -> list[Span]:
    """Drop empty spans, join neighbours with equal marks, trim outer separators."""
    out: list[Span] = []
    for span in spans:
        if not span.text:
            continue
        prev = out[-1] if out else None
        if prev and not prev.is_break and not span.is_break and prev.marks == span.marks:
            out[-1] = Span(prev.text + span.text, span.marks)
        else:
            out.append(span)
    while out and out[0].is_break:
        out.pop(0)
    while out and out[-1].is_break:
        out.pop()
    return out


# --------------------------------------------------------------------------- parsing

_MD: Final = MarkdownIt("commonmark").enable(["table", "strikethrough"])


_PLAIN: Final = re.compile(r"(?!.*\][(\[:])[^\W\d_](?:[^\W_]|[ ,.;:?!'\"()/%@$^\[\]])*(?<! )")
"""One line that CommonMark reads as a single paragraph of exactly these characters: it
starts with a letter and holds only letters, digits, spaces and punctuation with no meaning
to Markdown (no ``\\ ` * _ < > & # + - = | ~``, no line
break, no leading or trailing space). Square brackets are plain unless a ``]`` is followed by
``(``, ``[`` or ``:`` (an inline or reference link, a definition): a bracketed label with no
definition, such as a speaker's ``[Ana (U1)]`` echoed back, is literal text in CommonMark."""


def parse_document(markdown: str) -> Document:
    """Parse Markdown into the platform-neutral span document.

    Plain one-line text (many chat replies: "Sure, I can help with that.") skips the parser:
    markdown-it would return it unchanged, at about a tenth of a millisecond a reply.
    """
    if _PLAIN.fullmatch(markdown):
        return Document.from_spans((Span(markdown),))
    return parse_markdown(markdown)


def parse_markdown(markdown: str) -> Document:
    """:func:`parse_document` through the Markdown parser, whatever the text."""
    root = SyntaxTreeNode(_MD.parse(markdown))
    return Document.from_spans(_blocks(root.children, (), "\n\n"))


def _add(marks: tuple[Mark, ...], mark: Mark) -> tuple[Mark, ...]:
    # One mark per kind: nested quotes or bold-in-bold add nothing, and the outer
    # link wins, which also keeps Telegram's "no nested blockquote" rule.
    if any(m.kind == mark.kind for m in marks):
        return marks
    return (*marks, mark)


def _has_text(spans: Sequence[Span]) -> bool:
    return any(s.text.strip() for s in spans)


def _blocks(nodes: Sequence[SyntaxTreeNode], marks: tuple[Mark, ...], sep: str) -> list[Span]:
    out: list[Span] = []
    for node in nodes:
        rendered = _block(node, marks)
        if not _has_text(rendered):
            continue
        if out:
            out.append(Span(sep, marks, is_break=True))
        out.extend(rendered)
    return out


def _block(node: SyntaxTreeNode, marks: tuple[Mark, ...]) -> list[Span]:
    kind = node.type
    if kind == "paragraph":
        return _inline_of(node, marks)
    if kind == "heading":
        return _inline_of(node, _add(marks, Mark("bold")))
    if kind == "blockquote":
        return _blocks(node.children, _add(marks, Mark("quote")), "\n\n")
    if kind in ("bullet_list", "ordered_list"):
        return _list(node, marks)
    if kind in ("fence", "code_block"):
        lang = _language(node.info) if kind == "fence" else ""
        return [Span(node.content.rstrip("\n"), _add(marks, Mark("pre", lang)))]
    if kind == "table":
        return [Span(_table_text(node), _add(marks, Mark("pre")))]
    if kind == "hr":
        return [Span(_HR_TEXT, marks)]
    if kind == "html_block":
        # Raw HTML is shown literally; escaping happens when rendering.
        return [Span(node.content.rstrip("\n"), marks)]
    if node.children:
        return _blocks(node.children, marks, "\n\n")
    return [Span(node.content, marks)]


def _language(info: str) -> str:
    # Only the first word of the info string, restricted to characters that make a
    # sane CSS class name, so the attribute can never carry markup.
    words = info.split()
    return re.sub(r"[^\w+#.-]", "", words[0]) if words else ""


def _list(node: SyntaxTreeNode, marks: tuple[Mark, ...]) -> list[Span]:
    ordered = node.type == "ordered_list"
    start = int(str(node.attrs.get("start", 1))) if ordered else 1
    tight = any(
        child.type == "paragraph" and child.hidden
        for item in node.children
        for child in item.children
    )
    out: list[Span] = []
    for number, item in enumerate(node.children, start):
        prefix = f"{number}. " if ordered else _BULLET
        body = _blocks(item.children, marks, "\n" if tight else "\n\n")
        if out:
            out.append(Span("\n", marks, is_break=True))
        out.extend(_prefix_lines(body, prefix, " " * len(prefix), marks))
    return out


def _prefix_lines(
    body: Sequence[Span], first: str, rest: str, marks: tuple[Mark, ...]
) -> list[Span]:
    """Put ``first`` before the first line and ``rest`` before every later non-blank line."""
    out: list[Span] = []
    at_line_start, first_line = True, True
    for span in body:
        if span.is_break:
            out.append(span)
            at_line_start = True
            continue
        for part in re.split(r"(\n)", span.text):
            if part == "\n":
                out.append(Span(part, span.marks))
                at_line_start = True
            elif part:
                if at_line_start and first_line:
                    out.append(Span(first, marks))
                elif at_line_start and not _in_pre(span.marks):
                    # Code lines are not indented: code must stay copy-paste exact.
                    out.append(Span(rest, marks))
                at_line_start, first_line = False, False
                out.append(Span(part, span.marks))
    if first_line:
        out.insert(0, Span(first.rstrip(), marks))
    return out


def _in_pre(marks: tuple[Mark, ...]) -> bool:
    return any(m.kind == "pre" for m in marks)


def _inline_of(node: SyntaxTreeNode, marks: tuple[Mark, ...]) -> list[Span]:
    out: list[Span] = []
    for child in node.children:
        if child.type == "inline":
            out.extend(_inline(child.children, marks))
    return out


def _inline(nodes: Sequence[SyntaxTreeNode], marks: tuple[Mark, ...]) -> list[Span]:
    out: list[Span] = []
    for node in nodes:
        kind = node.type
        if kind in ("softbreak", "hardbreak"):
            out.append(Span("\n", marks))
        elif kind == "code_inline":
            out.append(Span(node.content, _add(marks, Mark("code"))))
        elif kind == "em":
            out.extend(_inline(node.children, _add(marks, Mark("italic"))))
        elif kind == "strong":
            out.extend(_inline(node.children, _add(marks, Mark("bold"))))
        elif kind == "s":
            out.extend(_inline(node.children, _add(marks, Mark("strike"))))
        elif kind == "link":
            href = str(node.attrs.get("href", ""))
            out.extend(_inline(node.children, _add(marks, Mark("link", href))))
        elif kind == "image":
            src = str(node.attrs.get("src", ""))
            alt = "".join(s.text for s in _inline(node.children, ())).strip()
            out.append(Span(alt or src, _add(marks, Mark("link", src))))
        elif node.children:
            out.extend(_inline(node.children, marks))
        else:
            # text, text_special, html_inline (shown literally) and anything unknown.
            out.append(Span(node.content, marks))
    return out


# --------------------------------------------------------------------------- tables


def _table_text(node: SyntaxTreeNode) -> str:
    rows: list[list[str]] = []
    aligns: list[str] = []
    for row in (r for r in node.walk() if r.type == "tr"):
        cells = [c for c in row.children if c.type in ("th", "td")]
        rows.append([_cell_text(c) for c in cells])
        if not aligns:
            aligns = [_cell_align(c) for c in cells]
    if not rows:
        return ""
    ncols = max(len(r) for r in rows)
    rows = [r + [""] * (ncols - len(r)) for r in rows]
    aligns += ["left"] * (ncols - len(aligns))
    widths = [max(_display_width(r[c]) for r in rows) for c in range(ncols)]
    lines = [_table_line(r, widths, aligns) for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell_text(cell: SyntaxTreeNode) -> str:
    return " ".join("".join(s.text for s in _inline_of(cell, ())).split())


def _cell_align(cell: SyntaxTreeNode) -> str:
    style = str(cell.attrs.get("style", ""))
    return style.removeprefix("text-align:") or "left"


def _table_line(cells: Sequence[str], widths: Sequence[int], aligns: Sequence[str]) -> str:
    padded = []
    for text, width, align in zip(cells, widths, aligns, strict=True):
        gap = width - _display_width(text)
        if align == "right":
            padded.append(" " * gap + text)
        elif align == "center":
            padded.append(" " * (gap // 2) + text + " " * (gap - gap // 2))
        else:
            padded.append(text + " " * gap)
    return " | ".join(padded).rstrip()


def _display_width(text: str) -> int:
    # Monospace columns: East Asian wide characters take two cells, combining marks none.
    width = 0
    for ch in text:
        if unicodedata.combining(ch):
            continue
        width += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return width


# --------------------------------------------------------------------------- splitting


def split_ranges(
    doc: Document, fits: Callable[[int, int], bool], max_len: int
) -> list[tuple[int, int]]:
    """Cut ``doc.text`` into ``(start, end)`` ranges for which ``fits(start, end)`` holds.

    ``fits`` must be monotone in ``end``; ``max_len`` bounds the search (no range
    longer than that many characters can fit). Split points, best first: a block
    separator, a newline, a space, and as a last resort any character boundary that
    does not break a grapheme cluster. The separator at a split point is dropped, as
    are newlines that would start a chunk; whitespace-only ranges are left out. So
    the chunks, in order, are exactly ``doc.text`` minus whitespace at split points.
    """
    text = doc.text
    finder = _BreakFinder.of(doc)
    ranges: list[tuple[int, int]] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos] == "\n":
            pos += 1
        if pos >= len(text):
            break
        end = _max_end(pos, min(len(text), pos + max_len), fits)
        if end == len(text):
            ranges.append((pos, end))
            break
        cut, resume = finder.choose(pos, end)
        ranges.append((pos, cut))
        pos = resume
    return [(a, b) for a, b in ranges if text[a:b].strip()]


def _max_end(start: int, hi: int, fits: Callable[[int, int], bool]) -> int:
    """Largest ``end`` in ``(start, hi]`` with ``fits(start, end)``, by binary search."""
    if fits(start, hi):
        return hi
    lo = start  # invariant: fits(start, lo) is true (an empty chunk always fits)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(start, mid):
            lo = mid
        else:
            hi = mid
    # Always make progress, even if a single character is over the limit; the
    # public renderers reject limits that small.
    return max(lo, start + 1)


@dataclass(frozen=True, slots=True)
class _BreakFinder:
    """Candidate split points of one document, sorted by position, per preference."""

    text: str
    block_starts: tuple[int, ...]
    block_ends: tuple[int, ...]
    newlines: tuple[int, ...]
    spaces: tuple[int, ...]

    @classmethod
    def of(cls, doc: Document) -> _BreakFinder:
        blocks = doc.block_breaks()
        inside = {i for start, end in blocks for i in range(start, end)}
        text = doc.text
        return cls(
            text=text,
            block_starts=tuple(start for start, _ in blocks),
            block_ends=tuple(end for _, end in blocks),
            newlines=tuple(i for i, c in enumerate(text) if c == "\n" and i not in inside),
            spaces=tuple(i for i, c in enumerate(text) if c in " \t" and i not in inside),
        )

    def choose(self, start: int, end: int) -> tuple[int, int]:
        """Best ``(cut, resume)`` for a chunk starting at ``start`` that fits up to ``end``."""
        full_enough = start + max(int((end - start) * MIN_FILL), 1)
        for minimum in (full_enough, start + 1):
            found = self._latest(self.block_starts, minimum, end)
            if found is not None:
                return self.block_starts[found], self.block_ends[found]
            for candidates in (self.newlines, self.spaces):
                found = self._latest(candidates, minimum, end)
                if found is not None:
                    return candidates[found], candidates[found] + 1
        cut = _grapheme_cut(self.text, start, end)
        return cut, cut

    @staticmethod
    def _latest(positions: Sequence[int], minimum: int, end: int) -> int | None:
        index = bisect.bisect_right(positions, end) - 1
        return index if index >= 0 and positions[index] >= minimum else None


_ZWJ: Final = "\u200d"
_MAX_CLUSTER: Final = 16


def _grapheme_cut(text: str, start: int, end: int) -> int:
    """Move a hard cut back so it does not split an emoji/combining sequence."""
    cut = end
    for _ in range(_MAX_CLUSTER):
        if cut - 1 <= start or not _joined(text[cut - 1], text[cut]):
            return cut
        cut -= 1
    return end  # an absurdly long cluster: cut it anyway


def _joined(before: str, after: str) -> bool:
    code = ord(after)
    return (
        before == _ZWJ
        or after == _ZWJ
        or unicodedata.combining(after) != 0
        or 0xFE00 <= code <= 0xFE0F  # variation selectors
        or 0x1F3FB <= code <= 0x1F3FF  # skin tone modifiers
        or 0xE0020 <= code <= 0xE007F  # tag characters (subdivision flags)
        or 0xE0100 <= code <= 0xE01EF  # variation selectors supplement
    )
