"""Tests for the pure Markdown -> Slack mrkdwn chunk renderer."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from channels.slack.render import SlackChunk, render_chunks, render_message_chunks

UNLIMITED = 10**9
FENCE_LINE = re.compile(r"(> ?)?(.*)```")
LINK = re.compile(r"<((?:https?|mailto):[^<>|\s]+)\|([^<>]*)>")
ENTITY = re.compile(r"&(amp|lt|gt);")
SYNTAX_CHARS = frozenset("*_~`\u200b")


def mrkdwn_text(mrkdwn: str) -> str:
    """Undo mrkdwn syntax: quote prefixes, links, escapes (delimiters stay in).

    Fails if a ``<`` or ``>`` remains that is not a quote prefix or a well-formed
    link, or if an ``&`` is not one of Slack's three escapes.
    """
    lines = [re.sub(r"^> ?", "", line) for line in mrkdwn.split("\n")]
    text = LINK.sub(r"\2", "\n".join(lines))
    assert "<" not in text, mrkdwn
    assert ">" not in text, mrkdwn
    assert re.fullmatch(r"([^&]|&(amp|lt|gt);)*", text, re.DOTALL), mrkdwn
    return ENTITY.sub(lambda m: {"amp": "&", "lt": "<", "gt": ">"}[m.group(1)], text)


def significant(text: str) -> str:
    """Text without whitespace and without characters mrkdwn uses as syntax."""
    return "".join(c for c in text if not c.isspace() and c not in SYNTAX_CHARS)


def fence_count(mrkdwn: str) -> int:
    """Number of lines that open or close a code block (lines ending in ```)."""
    return sum(1 for line in mrkdwn.split("\n") if line.endswith("```"))


def assert_chunk_ok(chunk: SlackChunk, limit: int) -> None:
    """A chunk fits, has balanced fences and shows the same text as its ``plain``."""
    assert len(chunk.mrkdwn) <= limit
    assert fence_count(chunk.mrkdwn) % 2 == 0, chunk.mrkdwn
    assert significant(mrkdwn_text(chunk.mrkdwn)) == significant(chunk.plain)
    assert chunk.plain.strip()


def assert_only_whitespace_dropped(full: str, pieces: Sequence[str]) -> None:
    """``full`` is ``pieces`` concatenated in order with only whitespace between them."""
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
    chunks = render_message_chunks(markdown, UNLIMITED)
    assert len(chunks) <= 1
    return chunks[0].plain if chunks else ""


def only(markdown: str) -> str:
    chunks = render_chunks(markdown)
    assert len(chunks) == 1
    return chunks[0]


# --------------------------------------------------------------------------- formatting


def test_inline_formatting() -> None:
    """Bold, italic, strike, inline code and links map to mrkdwn syntax."""
    assert only("**b** *i* ~~s~~ `c` [l](https://example.com/?a=1&b=2)") == (
        "*b* _i_ ~s~ `c` <https://example.com/?a=1&amp;b=2|l>"
    )


def test_nested_formatting_keeps_delimiters_on_word_edges() -> None:
    """Nested styles are wrapped per run, with spaces kept outside the delimiters."""
    assert only("**bold _both_ bold**") == "*bold* *_both_* *bold*"


def test_block_formatting() -> None:
    """Headings become bold lines, lists get bullets/numbers, quotes a > prefix."""
    assert only("# Title\n\n- one\n- two\n  - nested\n\n1. first\n\n> quoted\n>\n> more") == (
        "*Title*\n\n• one\n• two\n  • nested\n\n1. first\n\n> quoted\n>\n> more"
    )


def test_fenced_code_block() -> None:
    """Fenced code becomes a ``` block without the language, content escaped."""
    assert only("```python\nif a < b:\n    pass\n```") == "```\nif a &lt; b:\n    pass\n```"


def test_literal_fence_cannot_open_or_close_block() -> None:
    """A literal run of 3+ backticks in code or raw text is broken by zero-width spaces."""
    broken = "`\u200b`\u200b`"
    assert only("````md\n```py\nx\n```\n````") == f"```\n{broken}py\nx\n{broken}\n```"
    assert only("<div>\n`````\n</div>") == f"&lt;div&gt;\n{broken}\u200b`\u200b`\n&lt;/div&gt;"


def test_link_rules() -> None:
    """Only http(s)/mailto links become <url|text>; a | in the URL is encoded."""
    assert only("[a](https://x.y/a|b) [m](mailto:a@b.c) [r](/rel)") == (
        "<https://x.y/a%7Cb|a> <mailto:a@b.c|m> r"
    )


def test_escapes_script_mentions_and_ampersand() -> None:
    """<, > and & are escaped, so raw HTML and <!channel> stay literal text."""
    assert only("<script>alert(1)</script>\n\nAT&T <!channel> 1 > 0") == (
        "&lt;script&gt;alert(1)&lt;/script&gt;\n\nAT&amp;T &lt;!channel&gt; 1 &gt; 0"
    )


def test_empty_input_gives_no_chunks() -> None:
    """Empty or whitespace-only Markdown produces no message at all."""
    assert render_chunks("") == []
    assert render_chunks(" \n\n") == []


def test_too_small_limit_rejected() -> None:
    """A limit that could not hold one wrapped character is rejected."""
    with pytest.raises(ValueError, match="at least"):
        render_chunks("x", limit=10)


# --------------------------------------------------------------------------- splitting


def test_single_long_word_is_split() -> None:
    """A 10,000-character word is cut mid-word into full 3,000-character chunks."""
    word = "x" * 10_000
    chunks = render_chunks(word)
    assert [len(c) for c in chunks] == [3000, 3000, 3000, 1000]
    assert "".join(chunks) == word


def test_limit_counts_escapes_and_markup() -> None:
    """The limit applies to the mrkdwn text, so &amp; costs five characters."""
    chunks = render_chunks("&" * 1000)
    assert [len(c) for c in chunks] == [3000, 2000]


def test_emoji_counted_as_characters() -> None:
    """Slack's limit is in characters: an astral emoji counts as one."""
    chunks = render_chunks("😀" * 4000)
    assert [len(c) for c in chunks] == [3000, 1000]


def test_bold_reopened_across_split() -> None:
    """A bold run crossing split points is closed and reopened in each chunk."""
    chunks = render_chunks("**" + ("word " * 1500).strip() + "**")
    assert len(chunks) == 3
    for chunk in chunks:
        assert re.fullmatch(r"\*word( word)*\*", chunk)


def _long_reply() -> tuple[str, list[str]]:
    """About 9,000 characters: intro, a ~3,000-character python block, outro."""
    intro = "\n\n".join(
        f"Paragraph {i}: **the plan** uses `step_{i}` & checks <limits> carefully. " * 5
        for i in range(3)
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
            for i in range(16)
        ]
    )
    markdown = f"{intro}\n\n```python\n{code}\n```\n\n{outro}\n"
    return markdown, code.split("\n")


def test_long_reply_with_code_block_across_split() -> None:
    """A 9,000-character reply splits into valid chunks; the code fence is reopened.

    Asserted: every chunk is at most 3,000 characters of mrkdwn with an even number
    of fence lines and shows exactly its ``plain`` text (ignoring syntax characters
    and whitespace); the code block crosses a split point, so one chunk ends with a
    closing ``` and the next starts with an opening one; the code is cut between
    lines; and the unsplit plain rendering equals the chunks' plain texts
    concatenated in order with only whitespace removed at the split points.
    """
    markdown, code_lines = _long_reply()
    assert 8_500 <= len(markdown) <= 9_500
    assert 2_800 <= len("\n".join(code_lines)) <= 3_300

    chunks = render_message_chunks(markdown)
    assert len(chunks) >= 3
    for chunk in chunks:
        assert_chunk_ok(chunk, 3000)

    with_code = [i for i, c in enumerate(chunks) if "def step_" in c.mrkdwn]
    assert len(with_code) == 2
    first, second = with_code
    assert second == first + 1
    assert chunks[first].mrkdwn.endswith("\n```")
    assert chunks[second].mrkdwn.startswith("```\n")

    lines_in_chunks = [set(c.plain.split("\n")) for c in chunks]
    for line in code_lines:
        assert sum(line in lines for lines in lines_in_chunks) == 1, line

    assert_only_whitespace_dropped(full_plain(markdown), [c.plain for c in chunks])
    assert render_chunks(markdown) == [c.mrkdwn for c in chunks]


# --------------------------------------------------------------------------- properties

TOKENS = [
    "`",
    "```python\n",
    "```\n",
    "`````",
    "word",
    "longerword",
    "y" * 41,
    " ",
    "\n",
    "\n\n",
    "**",
    "*",
    "_",
    "~~strike~~",
    "`code`",
    "\n\n```python\nprint(1)\n\nx = 2\n```\n\n",
    "\n\n```\n<raw> & more\n```\n\n",
    "# ",
    "- ",
    "1. ",
    "> ",
    "    ",
    "&",
    "<",
    ">",
    "<script>",
    "<!channel>",
    "😀",
    "é",
    "[link](https://x.y/z?a=1&b=2)",
    "![img](https://i.j/k.png)",
    "[rel](/x)",
    "\n| a | b |\n|---|--:|\n| 1 | 22 |\n",
]

markdownish = st.lists(st.sampled_from(TOKENS), max_size=80).map("".join)


@settings(max_examples=400, deadline=None, database=None)
@given(markdown=markdownish, limit=st.integers(min_value=40, max_value=250))
def test_property_chunks_valid_and_lossless(markdown: str, limit: int) -> None:
    """Random markdown-ish text: chunks fit, fences balance, and no text is lost."""
    chunks = render_message_chunks(markdown, limit)
    for chunk in chunks:
        assert_chunk_ok(chunk, limit)
    assert_only_whitespace_dropped(full_plain(markdown), [c.plain for c in chunks])
