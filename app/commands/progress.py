"""One progress bar for every long operator job (export, drift, prune, import...).

A rich bar on stderr (``label  ━━━━━━  12/609  0:00:41``), so stdout stays clean for the
job's output; notes (a skipped session, a kept file) are printed above the bar. Only a
terminal gets the bar: into a file, a pipe or a log collector only the notes are written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID


class Ticker:
    """What a job sees of its bar: one step done, or a line to print above it."""

    def __init__(self, progress: Progress | None, task: TaskID | None, err: TextIO) -> None:
        self._progress = progress
        self._task = task
        self._err = err

    def advance(self, steps: int = 1) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, steps)

    def note(self, text: str) -> None:
        """A line above the bar (never markup: ids and paths are printed as they are)."""
        if self._progress is None:
            self._err.write(f"{text}\n")
            return
        self._progress.console.print(text, markup=False, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def progress(label: str, total: int, err: TextIO) -> Iterator[Ticker]:
    """A bar of ``total`` steps named ``label`` on ``err`` (a terminal) for the block."""
    if not _is_terminal(err):
        yield Ticker(None, None, err)
        return
    # rich is imported only for a terminal that gets a bar (it is most of a command's
    # start-up otherwise).
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    console = Console(file=err, stderr=True)
    columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console) as bar:
        yield Ticker(bar, bar.add_task(label, total=total), err)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or exotic stream
        return False
