"""Plain one-line replies skip the Markdown parser and come out exactly as the parser would
make them; anything else still goes through it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from channels.markdown import _PLAIN, Document, Span, parse_document, parse_markdown

# Every character the fast path allows, and those it must send to the parser.
PLAIN_CHARS = "abcXYZ019 ,.;:?!'\"()/%@$^[]éßñЖ日"
MARKDOWN_CHARS = "\\`*_<>&#+-=|~\n\t\r"


@pytest.mark.parametrize("text", [
    "Sure, I can help with that.", "message 3 in chat 1001", "Héllo wörld ñ", "a  b",
    "it's \"quoted\" (ok) 50% @x $5 / y?", "x:y", "Yes!", "A",
    "echo: [Ana (U0000101)] message 3", "see [1] and [2]", "a [b] (c)", "x [] y",
])
def test_plain_text_takes_the_fast_path_unchanged(text: str) -> None:
    """These are plain: one span of the text itself, as the parser makes it."""
    assert _PLAIN.fullmatch(text)
    assert parse_document(text) == Document.from_spans((Span(text),)) == parse_markdown(text)


@pytest.mark.parametrize("text", [
    "", " a", "a ", "1. first", "2) second", "a_b_", "*bold*", "a\nb", "- item", "# title",
    "> quote", "a & b", "<b>", "`x`", "[link](u)", "~~s~~", "a | b", "x\\y", "a=b", "+ x",
    "123", "a\tb", "[a](b)", "a [b][c]", "a [b][]", "a [b]: c", "![img](x)", "[x]",
])
def test_anything_markdown_could_read_differently_goes_to_the_parser(text: str) -> None:
    assert not _PLAIN.fullmatch(text)
    assert parse_document(text) == parse_markdown(text)


@settings(max_examples=400, deadline=None, database=None)
@given(text=st.text(alphabet=PLAIN_CHARS, max_size=60)
       | st.text(alphabet=PLAIN_CHARS + MARKDOWN_CHARS, max_size=60))
def test_the_fast_path_agrees_with_the_parser(text: str) -> None:
    """Whatever the text, the document is the one the Markdown parser makes."""
    assert parse_document(text) == parse_markdown(text)
