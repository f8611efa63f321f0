"""The progress bar of long operator jobs: drawn on a terminal, never into a pipe or a file,
where only the notes (skipped items) are written."""

from __future__ import annotations

import io

from app.commands.progress import progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_the_bar_and_the_notes() -> None:
    """On a terminal the bar shows the count done and the notes appear as written."""
    err = Terminal()
    with progress("drift", 3, err) as ticker:
        ticker.advance()
        ticker.note("gateway drift: skipped default/x: [not] markup")
        ticker.advance(2)
    text = err.getvalue()
    assert "3/3" in text
    assert "drift" in text
    assert "gateway drift: skipped default/x: [not] markup" in text


def test_a_pipe_gets_only_the_notes() -> None:
    """Into a non-terminal stream nothing but the notes is written, one per line."""
    err = io.StringIO()
    with progress("export", 2, err) as ticker:
        ticker.advance()
        ticker.note("gateway export: skipped default/y: unreadable")
        ticker.advance()
    assert err.getvalue() == "gateway export: skipped default/y: unreadable\n"
