"""Pairing state of one gateway (and its CLI): a private JSON file under the data folder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import orjson

from coordination.state_file import read_json, write_json

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
        data = self.read()
        before = orjson.dumps(data)
        result = change(data)
        if orjson.dumps(data) != before:
            write_json(self.path, data)
        return result
