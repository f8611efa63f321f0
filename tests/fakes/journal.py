"""A fault-injecting owed journal: the real file journal, whose disk fails on demand.

``journal.fault = OSError(errno.ENOSPC, ...)`` makes every append fail as a full disk would (an
``owe`` raises and records nothing; ``paid``/``drop`` lines are kept for later, as the real
one does when its ``os.write`` fails), until ``journal.fault = None``. The fault goes in at the
journal's own seam for the disk (``write_file``), so what the journal does about it is real.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from coordination.journal import FileJournal


class FaultyJournal(FileJournal):
    def __init__(self, path: Path | None, **options: Any) -> None:
        super().__init__(path, write_file=self._write_or_fail, **options)
        self.fault: OSError | None = None
        self.refused = 0

    def _write_or_fail(self, fd: int, data: memoryview) -> int:
        if self.fault is not None:
            self.refused += 1
            raise self.fault
        return os.write(fd, data)
