"""Shared test configuration."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _ptb_timedelta(monkeypatch: pytest.MonkeyPatch) -> None:
    """PTB 22 warns (an error here) on int time periods unless PTB_TIMEDELTA opts in."""
    monkeypatch.setenv("PTB_TIMEDELTA", "1")
