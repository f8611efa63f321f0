"""Render the model's Markdown into Slack ``mrkdwn`` chunks (pure, no I/O).

Parsing and splitting are shared with the Telegram renderer
(:mod:`channels.telegram.render`): the reply becomes a run of text spans with
formatting marks, the visible text is cut at the best split points (block
boundary, newline, space, mid-word as a last resort) and every chunk is rendered
on its own, so a code block or a bold run crossing a split point is closed at the
end of one chunk and reopened at the start of the next.

Mapping: ``*bold*``, ``_italic_``, ``~strike~``, ```code```, fenced code blocks
(```` ``` ```` fences, without the language: Slack would show it as code text),
``<url|text>`` links (http, https and mailto only; other links keep their text),
"• " / "1. " lists, headings as ``*bold*`` lines, ``> `` quoted lines, tables and
images as in the Telegram renderer. ``&``, ``<`` and ``>`` are escaped as
``&amp;``, ``&lt;``, ``&gt;`` everywhere, code included, as Slack requires; that
also neutralises ``<!channel>``-style mentions written by the model.

Limit: 3000 characters by default. That is the maximum length of a Block Kit
``section`` text object, and well under the 4,000 characters Slack recommends for
a message's top-level ``text`` (truncated at 40,000), so a chunk is usable in either
place. Slack counts the raw mrkdwn, so the measure is ``len()`` of the rendered
chunk, escapes and formatting characters included.

Limitations (Slack mrkdwn has no escape mechanism): a literal ``*``, ``_``, ``~`` or
`````` ` `````` in the text may still be read as formatting; formatting directly
next to a letter (``**a**b``) is not recognised by Slack; inline code containing a
backtick is sent unformatted; a literal ```` ``` ```` (in code or text) gets a
zero-width space so it cannot open or close a block; nested quotes are flattened.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from channels.markdown import Document, Mark, Span, parse_document, split_ranges

__all__ = ["SLACK_LIMIT", "SlackChunk", "render_chunks", "render_message_chunks"]

SLACK_LIMIT: Final = 3000

# Smallest limit that always fits one character with every wrapper it can need
# (quote prefix, fences or all inline delimiters, an escape and a short link URL).
_MIN_LIMIT: Final = 40
_SCHEMES: Final = frozenset({"http", "https", "mailto"})
_DELIMITERS: Final = {"bold": "*", "italic": "_", "strike": "~"}
_FENCE: Final = "```"
_BACKTICK_RUN: Final = re.compile("`{3,}")


@dataclass(frozen=True, slots=True)
class SlackChunk:
    """One message: ``mrkdwn`` to send, ``plain`` for the notification ``text`` fallback."""

    mrkdwn: str
    plain: str


def render_chunks(markdown: str, limit: int = SLACK_LIMIT) -> list[str]:
    """Render Markdown to mrkdwn strings of at most ``limit`` characters each."""
    return [chunk.mrkdwn for chunk in render_message_chunks(markdown, limit)]


def render_message_chunks(markdown: str, limit: int = SLACK_LIMIT) -> list[SlackChunk]:
    """Like :func:`render_chunks`, also returning each chunk's plain text."""
    if limit < _MIN_LIMIT:
        raise ValueError(f"limit must be at least {_MIN_LIMIT} characters")
    doc = _slack_document(parse_document(markdown), limit)

    def fits(start: int, end: int) -> bool:
        return len(_to_mrkdwn(doc.slice(start, end))) <= limit

    # Every visible character costs at least one mrkdwn character, so no chunk can
    # hold more than `limit` of them.
    return [
        SlackChunk(mrkdwn=_to_mrkdwn(doc.slice(a, b)), plain=doc.text[a:b])
        for a, b in split_ranges(doc, fits, limit)
    ]


def _slack_document(doc: Document, limit: int) -> Document:
    """Apply Slack's mark rules once, up front.

    Deciding per document rather than per chunk keeps the rendered length monotone
    in the chunk end, which the splitter's binary search relies on.
    """
    return Document.from_spans(
        Span(span.text, _slack_marks(span, limit), span.is_break) for span in doc.spans
    )


def _slack_marks(span: Span, limit: int) -> tuple[Mark, ...]:
    link = any(m.kind == "link" and _link_ok(m.attr, limit) for m in span.marks)
    kept: list[Mark] = []
    for mark in span.marks:
        if mark.kind == "link" and not link:
            continue
        # Slack cannot put code inside link text, nor escape a backtick in code.
        if mark.kind == "code" and (link or "`" in span.text):
            continue
        kept.append(mark)
    return tuple(kept)


def _link_ok(href: str, limit: int) -> bool:
    scheme, sep, _ = href.partition(":")
    # A URL that eats a large part of the budget is dropped (its text stays) so that
    # a chunk can always make progress, even when the link text is split.
    return bool(sep) and scheme.lower() in _SCHEMES and len(_url(href)) <= limit // 4


class _Lines:
    """Output lines; each line is quoted or not depending on its first content."""

    __slots__ = ("_lines", "_quoted")

    def __init__(self) -> None:
        self._lines: list[list[str]] = [[]]
        self._quoted: list[bool | None] = [None]

    def write(self, text: str, quoted: bool) -> None:
        if self._quoted[-1] is None:
            self._quoted[-1] = quoted
        self._lines[-1].append(text)

    def newline(self, quoted: bool) -> None:
        self.write("", quoted)
        self._lines.append([])
        self._quoted.append(None)

    def render(self) -> str:
        out = []
        for parts, quoted in zip(self._lines, self._quoted, strict=True):
            body = "".join(parts)
            prefix = ("> " if body else ">") if quoted else ""
            out.append(prefix + body)
        return "\n".join(out)


def _to_mrkdwn(spans: Sequence[Span]) -> str:
    lines = _Lines()
    for in_pre, group in itertools.groupby(spans, key=lambda s: _has(s.marks, "pre")):
        if in_pre:
            _code_block(lines, list(group))
        else:
            for span in group:
                _inline_span(lines, span)
    return lines.render()


def _has(marks: Iterable[Mark], kind: str) -> bool:
    return any(m.kind == kind for m in marks)


def _code_block(lines: _Lines, group: Sequence[Span]) -> None:
    quoted = _has(group[0].marks, "quote")
    lines.write(_FENCE, quoted)
    for line in "".join(s.text for s in group).split("\n"):
        lines.newline(quoted)
        lines.write(_escape(line), quoted)
    lines.newline(quoted)
    lines.write(_FENCE, quoted)


def _inline_span(lines: _Lines, span: Span) -> None:
    # Slack formatting cannot cross a line break, so each line is wrapped on its own.
    quoted = _has(span.marks, "quote")
    for index, part in enumerate(span.text.split("\n")):
        if index:
            lines.newline(quoted)
        if part:
            lines.write(_format_inline(part, span.marks), quoted)


def _format_inline(text: str, marks: Sequence[Mark]) -> str:
    core = text.strip()
    if not core:
        return _escape(text)
    # Delimiters must touch non-space characters or Slack ignores them, so the
    # surrounding whitespace goes outside.
    lead = text[: len(text) - len(text.lstrip())]
    trail = text[len(text.rstrip()) :]
    body = _escape(core)
    # Slack does not format inside link text, so the link is always innermost.
    link = next((m for m in marks if m.kind == "link"), None)
    if link is not None:
        body = f"<{_url(link.attr)}|{body}>"
    if _has(marks, "code"):
        body = f"`{body}`"
    for mark in reversed(marks):
        delimiter = _DELIMITERS.get(mark.kind, "")
        body = f"{delimiter}{body}{delimiter}"
    return lead + body + trail


def _url(href: str) -> str:
    # markdown-it already percent-encodes the URL; "|" would end the URL part early.
    return _escape(href).replace("|", "%7C")


def _escape(text: str) -> str:
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    # Slack has no way to escape a literal ``` (in code shown as an example, or in
    # raw text); zero-width spaces between the backticks keep it from opening or
    # closing a code block.
    return _BACKTICK_RUN.sub(lambda run: "\u200b".join(run.group()), text)
