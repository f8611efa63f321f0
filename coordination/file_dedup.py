"""A deduplicator that survives restarts: seen keys appended to a private JSONL file.

Slack redelivers events after reconnects and retries; Telegram redelivers updates whose offset
was not confirmed before a crash. Keys are kept ``ttl`` seconds (at least an hour). The file is
append-only (one ``[key, unix_time]`` line per key, a torn last line ignored) and is rewritten
with only live keys when it has grown to several times their number.

A key is claimed in memory by ``first_time`` and written to the file by ``keep``, which the
channel calls once the message is recorded: a gateway killed in between has not written the
key, so the platform's redelivery is taken after the restart instead of being dropped unseen.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from coordination.memory_dedup import MemoryDeduplicator
from sessions.files import FILE_MODE, ensure_private_dir


class FileDeduplicator:
    """See :class:`gateway.dedup.Deduplicator`. Single process (the gateway holds the file)."""

    def __init__(self, path: Path, ttl: float = 3600.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.ttl = ttl
        self.clock = clock
        self._seen: dict[str, float] = {}
        self._claimed: dict[str, float] = {}  # claimed by first_time, not kept (written) yet
        self._fd: int | None = None
        self._lines = 0

    def _open(self) -> int:
        if self._fd is not None:
            return self._fd
        ensure_private_dir(self.path.parent)
        now = self.clock()
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        for raw in data.split(b"\n"):
            try:
                key, at = orjson.loads(raw)
            except (orjson.JSONDecodeError, ValueError, TypeError):
                continue
            if isinstance(key, str) and isinstance(at, int | float) and now - at < self.ttl:
                self._seen[key] = float(at)
        self._rewrite()
        return self._fd if self._fd is not None else self._open()

    def _rewrite(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        tmp = self.path.with_suffix(".tmp")
        body = b"".join(orjson.dumps([k, at]) + b"\n" for k, at in self._seen.items())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        try:
            os.write(fd, body)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self._lines = len(self._seen)

    async def first_time(self, key: str) -> bool:
        if self._fd is None:  # the first load reads, compacts and fsyncs: off the loop
            await asyncio.to_thread(self._open)
        now = self.clock()
        at = self._seen.get(key, self._claimed.get(key))
        if at is not None and now - at < self.ttl:
            return False
        self._claimed[key] = now
        return True

    async def keep(self, key: str) -> None:
        fd = self._open()
        now = self.clock()
        at = self._claimed.pop(key, now)
        self._seen[key] = at
        # A small append to the page cache (it survives a killed process); done inline.
        os.write(fd, orjson.dumps([key, at]) + b"\n")
        self._lines += 1
        if self._lines > 4 * max(len(self._seen), 1000):
            self._seen = {k: t for k, t in self._seen.items() if now - t < self.ttl}
            self._claimed = {k: t for k, t in self._claimed.items() if now - t < self.ttl}
            self._rewrite()

    async def forget(self, key: str) -> None:
        self._claimed.pop(key, None)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


__all__ = ["FileDeduplicator", "MemoryDeduplicator"]
