"""Tests for the pure Markdown -> Telegram HTML chunk renderer."""

from __future__ import annotations

import re
from collections.abc import Sequence
from html.parser import HTMLParser

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from channels.telegram.render import (
    TelegramChunk,
    render_chunks,
    utf16_len,
    visible_len,
    visible_text,
)

ALLOWED_TAGS = frozenset({"b", "i", "s", "u", "code", "pre", "a", "blockquote"})
INLINE_STYLES = frozenset({"b", "i", "s", "u"})
UNLIMITED = 10**9


class _TelegramHtmlValidator(HTMLParser):
    """Checks that a string is balanced HTML using only tags Telegram accepts."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = [name for name, _ in attrs]
        if tag not in ALLOWED_TAGS:
            self.errors.append(f"tag <{tag}> not allowed")
        elif tag == "a" and names != ["href"]:
            self.errors.append(f"<a> attributes {names}")
        elif (
            tag == "code"
            and attrs
            and not (
                self.stack[-1:] == ["pre"]
                and names == ["class"]
                and str(attrs[0][1]).startswith("language-")
            )
        ):
            self.errors.append(f"<code> attributes {attrs} outside <pre>")
        elif tag not in ("a", "code") and attrs:
            self.errors.append(f"<{tag}> has attributes {attrs}")
        if "code" in self.stack or ("pre" in self.stack and tag != "code"):
            self.errors.append(f"<{tag}> nested in code")
        if tag == "blockquote" and tag in self.stack:
            self.errors.append("nested blockquote")
        if tag in ("code", "pre") and INLINE_STYLES & set(self.stack):
            self.errors.append(f"<{tag}> inside inline style {self.stack}")
        self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.errors.append(f"self-closing <{tag}/>")

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> does not close {self.stack[-1:]}")
        else:
            self.stack.pop()


def assert_well_formed(html: str) -> None:
    """Fail unless ``html`` is balanced Telegram HTML with only &amp; &lt; &gt; &quot;."""
    validator = _TelegramHtmlValidator()
    validator.feed(html)
    validator.close()
    assert not validator.errors, (validator.errors, html)
    assert not validator.stack, (f"unclosed {validator.stack}", html)
    assert re.fullmatch(r"([^&]|&(amp|lt|gt|quot);)*", html, re.DOTALL), html


def assert_chunk_ok(chunk: TelegramChunk, limit: int) -> None:
    """One chunk is well-formed, its HTML shows exactly ``plain``, and it fits."""
    assert_well_formed(chunk.html)
    assert visible_text(chunk.html) == chunk.plain
    assert visible_len(chunk.html) == utf16_len(chunk.plain) <= limit
    assert chunk.plain.strip(), "whitespace-only chunk"


def assert_only_whitespace_dropped(full: str, pieces: Sequence[str]) -> None:
    """``full`` is ``pieces`` concatenated in order with only whitespace between them.

    Nothing inside a piece differs from ``full``; the only text missing from the
    pieces is whitespace at split points (and around the ends).
    """
    pos = 0
    for piece in pieces:
        while not full.startswith(piece, pos):
            assert pos < len(full), ("piece not found", piece[:40])
            assert full[pos].isspace(), (pos, full[pos : pos + 40], piece[:40])
            pos += 1
        pos += len(piece)
    assert not full[pos:].strip()
    assert "".join(full.split()) == "".join("".join(pieces).split())


def full_plain(markdown: str) -> str:
    """The plain rendering of the whole reply without any splitting."""
    chunks = render_chunks(markdown, UNLIMITED)
    assert len(chunks) <= 1
    return chunks[0].plain if chunks else ""


def only(markdown: str) -> TelegramChunk:
    chunks = render_chunks(markdown)
    assert len(chunks) == 1
    return chunks[0]


# --------------------------------------------------------------------------- formatting


def test_inline_formatting() -> None:
    """Bold, italic, strike, inline code and links map to Telegram tags."""
    chunk = only("**b** *i* ~~s~~ `c` [l](https://example.com/?a=1&b=2)")
    assert chunk.html == (
        '<b>b</b> <i>i</i> <s>s</s> <code>c</code> <a href="https://example.com/?a=1&amp;b=2">l</a>'
    )
    assert chunk.plain == "b i s c l"


def test_block_formatting() -> None:
    """Headings become bold lines, lists get bullets/numbers, quotes a blockquote."""
    chunk = only("# Title\n\n- one\n- two\n  - nested\n\n3. three\n4. four\n\n> quoted *x*")
    assert chunk.html == (
        "<b>Title</b>\n\n• one\n• two\n  • nested\n\n3. three\n4. four\n\n"
        "<blockquote>quoted <i>x</i></blockquote>"
    )


def test_fenced_code_keeps_language() -> None:
    """A fenced block with a language becomes <pre><code class="language-x">."""
    chunk = only("```python\nif a < b:\n    pass\n```")
    assert chunk.html == '<pre><code class="language-python">if a &lt; b:\n    pass</code></pre>'
    assert only("```\nplain\n```").html == "<pre>plain</pre>"


def test_table_becomes_aligned_pre() -> None:
    """A table renders as aligned monospace text in a <pre> block."""
    chunk = only("| name | qty |\n|:--|--:|\n| apple | 3 |\n| kiwi | 12 |")
    assert chunk.html == "<pre>name  | qty\n------+----\napple |   3\nkiwi  |  12</pre>"


def test_image_becomes_link() -> None:
    """An image becomes a link showing its alt text (or its URL when alt is empty)."""
    assert only("![a cat](https://x.org/cat.png)").html == (
        '<a href="https://x.org/cat.png">a cat</a>'
    )
    assert only("![](https://x.org/c.png)").plain == "https://x.org/c.png"


def test_unsupported_link_scheme_keeps_text_only() -> None:
    """Links Telegram would reject (relative, mailto) are rendered as their text."""
    assert only("[docs](/docs) [mail](mailto:a@b.c)").html == "docs mail"


def test_code_nested_in_bold_drops_bold() -> None:
    """Telegram forbids code inside b/i/s, so bold is closed around inline code."""
    assert only("**a `c` b**").html == "<b>a </b><code>c</code><b> b</b>"


def test_escapes_script_and_ampersand() -> None:
    """Raw HTML and & are escaped as text, never passed through as markup."""
    chunk = only("<script>alert('x')</script>\n\nAT&T <b>bold?</b> & 1 < 2")
    assert chunk.html == (
        "&lt;script&gt;alert('x')&lt;/script&gt;\n\n"
        "AT&amp;T &lt;b&gt;bold?&lt;/b&gt; &amp; 1 &lt; 2"
    )
    assert chunk.plain == "<script>alert('x')</script>\n\nAT&T <b>bold?</b> & 1 < 2"
    assert_well_formed(chunk.html)


def test_empty_input_gives_no_chunks() -> None:
    """Empty or whitespace-only Markdown produces no message at all."""
    assert render_chunks("") == []
    assert render_chunks("  \n\n ") == []


def test_limit_must_fit_an_astral_character() -> None:
    """A limit below 2 UTF-16 units is rejected instead of producing oversize chunks."""
    with pytest.raises(ValueError, match="at least 2"):
        render_chunks("x", limit=1)


# --------------------------------------------------------------------------- measuring


def test_utf16_and_visible_length() -> None:
    """Astral characters count as 2 units; entities and tags as their visible text."""
    assert utf16_len("a😀é") == 4
    assert visible_len('<b>&amp;😀</b><a href="https://x.y/?a&amp;b">l</a>') == 4


def test_emoji_counted_as_two_units() -> None:
    """3,000 emoji (6,000 UTF-16 units) need two 4,096-unit chunks, not one."""
    chunks = render_chunks("😀" * 3000)
    assert [len(c.plain) for c in chunks] == [2048, 952]
    for chunk in chunks:
        assert_chunk_ok(chunk, 4096)


def test_zwj_emoji_sequence_not_cut() -> None:
    """A hard cut backs off so a ZWJ emoji sequence stays in one chunk."""
    family = "👨\u200d👩\u200d👧"
    chunks = render_chunks("a" * 4093 + family + "b" * 10)
    assert [c.plain for c in chunks] == ["a" * 4093, family + "b" * 10]


# --------------------------------------------------------------------------- splitting


def test_single_long_word_is_split() -> None:
    """A 10,000-character word is cut mid-word into full chunks, losing nothing."""
    word = "x" * 10_000
    chunks = render_chunks(word)
    assert [len(c.plain) for c in chunks] == [4096, 4096, 1808]
    assert "".join(c.plain for c in chunks) == word


def test_prefers_paragraph_boundary() -> None:
    """Two 3,000-character paragraphs are split exactly between them."""
    first, second = "a " * 1500, "b " * 1500
    chunks = render_chunks(f"{first}\n\n{second}")
    assert [c.plain for c in chunks] == [first.strip(), second.strip()]


def test_prefers_space_over_mid_word() -> None:
    """Without block or line breaks, a paragraph is split at a space."""
    words = " ".join(f"w{i:04d}" for i in range(1500))
    chunks = render_chunks(words, limit=100)
    assert all(re.fullmatch(r"w\d{4}( w\d{4})*", c.plain) for c in chunks)
    assert_only_whitespace_dropped(words, [c.plain for c in chunks])


def test_inline_formatting_reopened_across_split() -> None:
    """A bold run crossing split points is closed and reopened in each chunk."""
    chunks = render_chunks("**" + ("word " * 2000).strip() + "**")
    assert len(chunks) == 3
    for chunk in chunks:
        assert chunk.html.startswith("<b>")
        assert chunk.html.endswith("</b>")
        assert_chunk_ok(chunk, 4096)


def _long_reply() -> tuple[str, list[str]]:
    """About 9,000 characters: intro, a ~3,000-character python block, outro."""
    intro = "\n\n".join(
        f"Paragraph {i}: **the plan** uses `step_{i}` & checks <limits> carefully. " * 5
        for i in range(4)
    )
    code_lines = [
        f"def step_{i}(x: int) -> bool:\n    return x < {i} and x & 0xFF != {i}  # <tag>"
        for i in range(40)
    ]
    code = "\n".join(code_lines)
    outro = "\n\n".join(
        [
            f"- item {i}: *note* with [a link](https://example.com/{i}) and more words"
            for i in range(20)
        ]
        + [
            f"Closing remark {i}, with ~~old~~ new text and a bit of padding. " * 4
            for i in range(13)
        ]
    )
    markdown = f"{intro}\n\n```python\n{code}\n```\n\n{outro}\n"
    return markdown, code.split("\n")


def test_long_reply_with_code_block_across_split() -> None:
    """A 9,000-character reply splits into valid chunks; the code block is reopened.

    Asserted: every chunk is well-formed Telegram HTML whose visible text is its
    ``plain`` and at most 4,096 UTF-16 units; the python block crosses a split point,
    the first part ends with </code></pre> and the next chunk reopens it with
    class="language-python"; the code is cut between lines (each source line appears
    whole in one chunk); and the unsplit plain rendering equals the chunks' plain
    texts concatenated in order with only whitespace removed at the split points.
    """
    markdown, code_lines = _long_reply()
    assert 8_500 <= len(markdown) <= 9_500
    assert 2_800 <= len("\n".join(code_lines)) <= 3_300

    chunks = render_chunks(markdown)
    assert len(chunks) >= 2
    for chunk in chunks:
        assert_chunk_ok(chunk, 4096)

    with_code = [i for i, c in enumerate(chunks) if "language-python" in c.html]
    assert len(with_code) == 2
    first, second = with_code
    assert second == first + 1
    assert chunks[first].html.endswith("</code></pre>")
    assert chunks[second].html.startswith('<pre><code class="language-python">')
    assert code_lines[0] in chunks[first].plain
    assert code_lines[-1] in chunks[second].plain

    lines_in_chunks = [set(c.plain.split("\n")) for c in chunks]
    for line in code_lines:
        assert sum(line in lines for lines in lines_in_chunks) == 1, line

    assert_only_whitespace_dropped(full_plain(markdown), [c.plain for c in chunks])


def test_code_block_split_reopens_language_small_limit() -> None:
    """Every piece of a code block split many times is wrapped in its own pre/code."""
    code = "\n".join(f"line_{i} = {i}" for i in range(50))
    chunks = render_chunks(f"```rust\n{code}\n```", limit=60)
    assert len(chunks) > 5
    for chunk in chunks:
        assert chunk.html.startswith('<pre><code class="language-rust">')
        assert chunk.html.endswith("</code></pre>")
        assert_chunk_ok(chunk, 60)
    assert "\n".join(c.plain for c in chunks) == code


# --------------------------------------------------------------------------- properties

TOKENS = [
    "word",
    "longerword",
    "x" * 37,
    " ",
    "  ",
    "\n",
    "\n\n",
    "**",
    "*",
    "_",
    "~~",
    "`",
    "```python\n",
    "```\n",
    "# ",
    "## ",
    "- ",
    "1. ",
    "> ",
    "    ",
    "&",
    "<",
    ">",
    "<script>",
    "</b>",
    "&amp;",
    '"',
    "\\",
    "😀",
    "👨\u200d👩\u200d👧",
    "é",
    "e\u0301",
    "[link](https://x.y/z?a=1&b=2)",
    "![img](https://i.j/k.png)",
    "[rel](/x)",
    "<https://auto.link>",
    "\n| a | b |\n|---|--:|\n| 1 | 22 |\n",
    "\n---\n",
]

markdownish = st.lists(st.sampled_from(TOKENS), max_size=80).map("".join)


@settings(max_examples=400, deadline=None, database=None)
@given(markdown=markdownish, limit=st.integers(min_value=2, max_value=150))
def test_property_chunks_valid_and_lossless(markdown: str, limit: int) -> None:
    """Random markdown-ish text: chunks are well-formed, fit, and lose no visible text."""
    chunks = render_chunks(markdown, limit)
    for chunk in chunks:
        assert_chunk_ok(chunk, limit)
    assert_only_whitespace_dropped(full_plain(markdown), [c.plain for c in chunks])


@settings(max_examples=200, deadline=None, database=None)
@given(markdown=markdownish)
def test_property_unsplit_render_is_valid(markdown: str) -> None:
    """Random markdown-ish text renders unsplit to a single valid chunk (or none)."""
    chunks = render_chunks(markdown, UNLIMITED)
    assert len(chunks) <= 1
    for chunk in chunks:
        assert_chunk_ok(chunk, UNLIMITED)
