"""Small private JSON state files (pairing, approvals): atomic 0600 writes in 0700 dirs."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import orjson

from sessions.files import FILE_MODE, ensure_private_dir


def read_json(path: Path, default: Any) -> Any:
    try:
        return orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return default
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON; fix or remove it") from exc


def write_json(path: Path, value: Any) -> None:
    """Write atomically: temp file (0600) in the same directory, fsync, rename."""
    ensure_private_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, FILE_MODE)
        os.write(fd, orjson.dumps(value, option=orjson.OPT_INDENT_2))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
