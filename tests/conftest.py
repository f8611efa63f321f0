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


# The trials that run `gateway run` subprocesses under load of their own (crash-kill, disk
# faults, worker kills, outages) take turns on pytest-xdist workers (``--dist loadgroup``), in
# two groups: all of them side by side would load the machine far past what each was written
# for, and a subprocess that cannot start in time fails a trial for a reason that is not its
# subject; all of them on one worker made that worker the whole suite's critical path (about
# 8 minutes on a slow 2-core machine, while the other workers had long finished). The crash-kill
# runs (about half the trials' time) take one worker, the other trials another.
SOLO_TRIALS = {
    "tests/reliability/test_crash_kill.py": "crash-trials",
    "tests/reliability/test_crash_replies.py": "heavy-trials",
    "tests/reliability/test_disk_faults.py": "heavy-trials",
    "tests/reliability/test_load.py": "heavy-trials",
    "tests/coordination/test_multi_worker.py": "heavy-trials",
    "tests/coordination/test_outages.py": "heavy-trials",
    "tests/coordination/test_schedule_workers.py": "heavy-trials",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put the heavy trials in their ``xdist_group`` (see :data:`SOLO_TRIALS`)."""
    for item in items:
        group = SOLO_TRIALS.get(item.nodeid.split("::", 1)[0])
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
