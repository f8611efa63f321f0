"""One layer of the persona: a directory of files, cached in memory, reloaded when they change.

Hot reload: :meth:`Layer.sync` scans the layer's directories (one ``os.scandir`` each plus
one ``lstat`` per tracked file) and compares each file's ``(mtime_ns, size, inode)`` stamp with
the one it last read or wrote. Only changed files are re-read (in a worker thread). A change the
layer made itself (:meth:`Layer.mutate`, for a tool) records the tool's name as the cause; any
other difference found on disk records ``file_changed``. Limitation: an in-place edit that keeps
size and inode within the file system's timestamp granularity is invisible until the next edit.

A layer built with ``rescan_after`` scans at most once in that many seconds (the operator's and
tenants' layers in ``gateway run``: ``GATEWAY_PERSONA_RESCAN``): those scans were the largest
single cost of a turn's CPU on the event loop (8-9 % under load, more with a large ``kb/``), and
an edit made by hand is then seen within that time. The layer's own writes are seen at once,
and a write always scans first. A person's scope layer keeps ``rescan_after=0``: its files are
that person's memory, and an erasure done by another worker must never be served from a cache.

Every change takes a new number from the workspace's shared counter (:attr:`Layer.changed_at`),
so the layers of one prompt can tell which of them changed last (its cause is the prompt's).
A prompt cached under its layers' :attr:`Layer.generation` numbers is never served after any
of them changed, even when a layer was dropped from memory and loaded again: a fresh layer
starts at a fresh generation.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from gateway.edge.errors import ToolError
from gateway.persona.files import NO_STAMP, Stamp, atomic_write, read_files, scan, scan_targets
from gateway.persona.kb import Note

CAUSE_INITIAL = "initial"
CAUSE_FILE_CHANGED = "file_changed"

Plan = Callable[[], tuple[str, str]]
"""Worker thread: ``(key, new text)`` computed from what is on disk now."""


class Layer:
    """The tracked files of one directory: ``files`` in it, ``*.md`` in each of ``dirs``.

    ``base`` is the directory below which missing directories are created ``0700`` on the
    first write (the workspace root). ``on_first_write`` runs in the worker thread before a
    write that creates the layer's directory (a scope writes its ``scope.json`` then).
    """

    def __init__(
        self,
        root: Path,
        files: frozenset[str],
        dirs: Sequence[str],
        counter: Iterator[int],
        *,
        base: Path | None = None,
        on_first_write: Callable[[], None] | None = None,
        rescan_after: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self.files = files
        self.dirs = tuple(dirs)
        self._targets = scan_targets(root, self.dirs)
        self.base = base
        self._counter = counter
        self._on_first_write = on_first_write
        self._rescan_after = rescan_after
        self._clock = clock
        self._scanned_at = 0.0
        self._lock = asyncio.Lock()
        self._stamps: dict[str, Stamp] = {}
        self._texts: dict[str, str] = {}
        self._loaded = False
        self.generation = next(counter)
        """Changes whenever the layer's texts may have: on creation, on every change."""
        self.changed_at = 0
        """When the layer last changed (0: never since it was loaded); orders causes."""
        self.cause = CAUSE_INITIAL

    # -- reading ------------------------------------------------------------------------------

    def text(self, key: str) -> str:
        """The file's cached text, surrounding whitespace stripped (``""`` when missing)."""
        return self._texts.get(key, "").strip()

    def keys(self, directory: str) -> list[str]:
        """Cached keys (``dir/name.md``) below ``directory``, sorted."""
        return sorted(k for k in self._texts if k.startswith(f"{directory}/"))

    def notes(self, directory: str, prefix: str = "") -> list[Note]:
        """The files of ``directory`` as kb notes, keys prefixed to be unique across layers."""
        return [Note(self._stamps[k][0], prefix + k, self._texts[k]) for k in self.keys(directory)]

    async def sync(self, *, force: bool = False) -> None:
        """Bring the cache up to date with the disk; cheap (stats only) when nothing changed.
        Within ``rescan_after`` seconds of the last scan it does nothing, unless ``force``."""
        now = self._clock()
        if self._loaded and not force and now - self._scanned_at < self._rescan_after:
            return
        if self._loaded and scan(self._targets, self.files) == self._stamps:
            self._scanned_at = now
            return
        async with self._lock:
            # A tool write may have finished while we waited: only what still differs counts.
            current = scan(self._targets, self.files)
            self._scanned_at = now
            if self._loaded and current == self._stamps:
                return
            changed = [k for k, st in current.items() if self._stamps.get(k) != st]
            self._load(current, await asyncio.to_thread(read_files, self.root, changed))
            if self._loaded:
                self._changed(CAUSE_FILE_CHANGED)
            self._loaded = True

    def _load(self, current: Mapping[str, Stamp], read: Mapping[str, tuple[Stamp, str]]) -> None:
        for key in [k for k in self._stamps if k not in current]:
            del self._stamps[key]
            self._texts.pop(key, None)
        for key, (stamp, text) in read.items():
            # An unreadable file keeps its scan stamp with empty text, so it is not re-read
            # on every build; a later edit changes the stamp and retries.
            self._stamps[key] = stamp if stamp != NO_STAMP else current[key]
            self._texts[key] = text

    # -- writing ------------------------------------------------------------------------------

    async def mutate(self, plan: Plan, cause: str) -> str:
        """Apply ``plan`` atomically, update the cache, record ``cause``; returns the key.

        ``plan`` raises :class:`ToolError` for a request it refuses; a failed write is a
        :class:`ToolError` too (the model is told, the turn goes on).
        """
        await self.sync(force=True)
        async with self._lock:
            try:
                key, stamp, text = await asyncio.to_thread(self._apply, plan)
            except OSError as exc:
                raise ToolError(f"could not save: {exc.strerror or type(exc).__name__}") from exc
            self._stamps[key] = stamp
            self._texts[key] = text
            self._changed(cause)
        return key

    def _apply(self, plan: Plan) -> tuple[str, Stamp, str]:
        key, text = plan()
        if self._on_first_write is not None and not self.root.is_dir():
            self._on_first_write()
        return key, atomic_write(self.root / key, text, base=self.base), text

    async def wipe(self, remove: Callable[[Path], list[str]], cause: str) -> list[str]:
        """Run ``remove(root)`` in a worker thread under the write lock (a tool write never
        interleaves with it), then drop the cache; returns what ``remove`` returns."""
        async with self._lock:
            removed = await asyncio.to_thread(remove, self.root)
            self._stamps.clear()
            self._texts.clear()
            self._changed(cause)
        return removed

    def _changed(self, cause: str) -> None:
        self.generation = self.changed_at = next(self._counter)
        self.cause = cause


def new_counter() -> Iterator[int]:
    """The shared change counter of one workspace (starts at 1; 0 means never)."""
    return itertools.count(1)
