"""Shared test configuration."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from tests.capabilities import missing


@pytest.fixture(autouse=True)
def _ptb_timedelta(monkeypatch: pytest.MonkeyPatch) -> None:
    """PTB 22 warns (an error here) on int time periods unless PTB_TIMEDELTA opts in."""
    monkeypatch.setenv("PTB_TIMEDELTA", "1")


@pytest.fixture(autouse=True)
def _logging_left_as_found() -> Iterator[None]:
    """A test that configures logging (``gateway run`` in-process) must not leave its handler,
    bound to a stream that is closed once the test ends, to the tests after it."""
    root = logging.getLogger()
    before, level = set(root.handlers), root.level
    yield
    for handler in root.handlers[:]:
        if handler not in before and not type(handler).__module__.startswith("_pytest"):
            root.removeHandler(handler)
    root.setLevel(level)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@needs(what, present)`` (tests/capabilities.py): skip here, fail in CI."""
    for mark in item.iter_markers("needs"):
        if not mark.kwargs["present"]:
            missing(mark.kwargs["what"])
