"""Pairing state of one gateway (and its CLI): a private JSON file under the data folder.

The gateway (writing behind, see :mod:`gateway.access.pairing_live`) and ``gateway pairing`` are two
processes changing one file: every update is a read-modify-write under an exclusive ``flock``
on a lock file beside it, so neither loses the other's change.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import orjson

from coordination.state_file import read_json, write_json
from sessions.files import FILE_MODE, ensure_private_dir

T = TypeVar("T")


def pairing_path(data_dir: Path) -> Path:
    return data_dir / "access" / "pairing.json"


class FilePairingState:
    """The document in a private JSON file, re-read on every call (the CLI is another process)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def under(cls, data_dir: Path) -> FilePairingState:
        """The state at ``<data_dir>/access/pairing.json``."""
        return cls(pairing_path(data_dir))

    def read(self) -> dict[str, Any]:
        data = read_json(self.path, {})
        return data if isinstance(data, dict) else {}

    def update(self, change: Callable[[dict[str, Any]], T]) -> T:
        ensure_private_dir(self.path.parent)
        lock = os.open(self.path.with_name(f".{self.path.name}.lock"),
                       os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, FILE_MODE)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self.read()
            before = orjson.dumps(data)
            result = change(data)
            if orjson.dumps(data) != before:
                write_json(self.path, data)
            return result
        finally:
            os.close(lock)  # also releases the lock
