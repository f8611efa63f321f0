"""A fault-injecting owed journal: the real file journal, whose writes fail on demand.

``journal.fault = OSError(errno.ENOSPC, ...)`` makes every write fail as a full disk would (an
``owe`` raises and records nothing; ``paid``/``drop`` lines are kept for later, as the real
one does when its ``os.write`` fails), until ``journal.fault = None``.
"""

from __future__ import annotations

from coordination.journal import FileJournal


class FaultyJournal(FileJournal):
    fault: OSError | None = None
    refused = 0

    def _write(self, line: bytes, *, keep: bool) -> None:
        if self.fault is not None:
            self.refused += 1
            if keep:
                self._backlog += line
            raise self.fault
        super()._write(line, keep=keep)
