"""One log line per failure episode: the first failure, then one line when it recovers.

A store or Redis outage fails every request until it ends; logging each one buries the log
(and the one line an operator needs) under thousands of copies. :class:`Episode` logs the
first failure of an episode with its kind, counts the rest, and logs one recovery line with
the count when something succeeds again.
"""

from __future__ import annotations

import logging


class Episode:
    """Failure-episode logging for one thing that can fail (``what``: a short noun phrase)."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        self._log = log
        self.what = what
        self.failures = 0
        self.kind: str | None = None

    @property
    def failing(self) -> bool:
        return self.failures > 0

    def failed(self, kind: str, *, level: int = logging.WARNING) -> bool:
        """Count a failure; log it only when it starts an episode (returns True then)."""
        self.failures += 1
        if self.failures > 1:
            return False
        self.kind = kind
        self._log.log(level, "%s failed (%s); further failures are counted until it recovers",
                      self.what, kind)
        return True

    def ok(self) -> None:
        """A success: ends an episode (one line with how many failures it had)."""
        if self.failures:
            self._log.info("%s recovered after %d failure(s) (%s)", self.what, self.failures,
                           self.kind)
            self.failures = 0
            self.kind = None
