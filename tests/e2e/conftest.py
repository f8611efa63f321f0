"""Every end-to-end test ends with the same check of what it recorded: for every call of every
session log it left under its ``tmp_path``, replay shows the system prompt the model read (see
:mod:`tests.e2e.replaying`; the suites that hold the bodies the provider received also compare
with those)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.replaying import check_every_log_under


@pytest.fixture(autouse=True)
def _replay_shows_what_was_read(tmp_path: Path) -> Iterator[None]:
    yield
    check_every_log_under(tmp_path)
