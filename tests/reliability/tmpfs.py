"""A tiny tmpfs for the disk-fault trials: mounted by the test, filled (ENOSPC) and made
read-only (EROFS) under a running gateway, then given back.

Mounting needs root (or CAP_SYS_ADMIN); :func:`mount_tmpfs` raises :class:`MountRefused` with
the system's reason where it is not permitted, for the test to skip on.

Read-only: ``mount -o remount,ro`` of a filesystem with a file open for writing fails with
EBUSY (the kernel counts writers per mount), and a running gateway always holds its owed
journal and its open sessions that way. So :meth:`Tmpfs.read_only` stacks a read-only bind
mount of the data directory over itself instead: every path looked up from then on is on a
read-only mount, so every open for writing, create, rename and unlink there fails with EROFS,
while descriptors opened before keep writing. (A filesystem the kernel forces read-only after
an error refuses those writes too; that case is not played here: ext4 will not go back to
read-write without an unmount.) Lifting it is a lazy unmount of the top layer.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

CHUNK = 1 << 20


class MountRefused(Exception):
    """Mounting is not permitted here (not root, no CAP_SYS_ADMIN, a locked-down sandbox)."""


def _run(*args: str) -> None:
    done = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise OSError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")


class Tmpfs:
    """A tmpfs of ``size`` bytes mounted at ``path``; :meth:`unmount` in a ``finally``."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self.filler = path / "filler"
        self._overlays: list[Path] = []
        self.mounted = False

    def mount(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        try:
            _run("mount", "-t", "tmpfs", "-o", f"size={self.size},mode=0755", "tmpfs",
                 str(self.path))
        except (OSError, subprocess.SubprocessError) as exc:
            raise MountRefused(str(exc)) from exc
        self.mounted = True

    def fill(self) -> int:
        """Write a filler file until the filesystem is full (ENOSPC); returns its size."""
        written = 0
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for size in (CHUNK, 4096, 1):  # big steps first, then the last page, byte by byte
                block = b"\0" * size
                while True:
                    try:
                        written += os.write(fd, block)
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
        finally:
            os.close(fd)
        return written

    def free(self) -> None:
        """Remove the filler: the space is there again."""
        self.filler.unlink(missing_ok=True)

    def read_only(self, directory: Path) -> None:
        """Make ``directory`` (on this tmpfs) read-only for every new lookup; see the module
        docstring for why not ``remount,ro``."""
        _run("mount", "--bind", str(directory), str(directory))
        self._overlays.append(directory)
        _run("mount", "-o", "remount,bind,ro", str(directory))

    def writable(self) -> None:
        """Lift :meth:`read_only` (lazily: the gateway may hold a directory open there)."""
        while self._overlays:
            _run("umount", "-l", str(self._overlays.pop()))

    def unmount(self) -> None:
        """Everything this put up, lazily (a killed process's files may linger a moment)."""
        self.writable()
        if self.mounted:
            _run("umount", "-l", str(self.path))
            self.mounted = False
