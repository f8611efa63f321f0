"""Memory scopes on disk, as the operator sees them: list, show, delete (``gateway memory``).

A scope's directory is ``<persona>/memory/<tenant>/<channel>/people|chats/<segment>/``
(:attr:`gateway.edge.scopes.Scope.path`), holding ``MEMORY.md``, ``MOOD.md``, ``kb/*.md`` and
``scope.json`` (tenant, channel, kind and raw id, written with the first file, so a listing
can name a scope whose id had to be hashed into its directory name). Blocking file I/O: the
CLI calls these directly, the gateway in a worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson

from gateway.edge.ids import valid_id
from gateway.edge.scopes import KIND_DIRS, Scope, ScopeError
from gateway.persona.files import read_text, remove_tree

MEMORY_DIR = "memory"
SCOPE_FILE = "scope.json"


@dataclass(frozen=True, slots=True)
class ScopeSummary:
    """One scope found on disk; ``scope`` is None when its ``scope.json`` is unreadable."""

    scope: Scope | None
    path: str
    files: int
    size: int


def scope_dir(root: Path, scope: Scope) -> Path:
    """The directory of ``scope`` under the persona workspace ``root``."""
    return root / MEMORY_DIR / scope.path


def list_scopes(root: Path, tenant: str | None = None) -> list[ScopeSummary]:
    """Every scope with a directory (of one tenant, or all), sorted by path; an unsafe tenant
    name is :class:`~gateway.edge.ids.InvalidIdError`."""
    base = root / MEMORY_DIR
    # A tenant from the command line is checked like any id before it goes near a path.
    pattern = f"{valid_id(tenant, 'tenant') if tenant is not None else '*'}/*/*/*"
    found: list[ScopeSummary] = []
    for directory in sorted(base.glob(pattern)) if base.is_dir() else []:
        rel = directory.relative_to(base)
        if not directory.is_dir() or directory.is_symlink() or rel.parts[2] not in set(
                KIND_DIRS.values()):
            continue
        files = [p for p in directory.rglob("*") if p.is_file() and p.name != SCOPE_FILE]
        found.append(ScopeSummary(_described(directory), rel.as_posix(), len(files),
                                  sum(p.stat().st_size for p in files)))
    return found


def scope_files(root: Path, scope: Scope) -> list[tuple[str, str]]:
    """``(path relative to the scope, text)`` of every memory file of ``scope``, sorted."""
    directory = scope_dir(root, scope)
    if not directory.is_dir():
        return []
    paths = sorted(p for p in directory.rglob("*")
                   if p.is_file() and not p.is_symlink() and p.name != SCOPE_FILE)
    return [(p.relative_to(directory).as_posix(), read_text(p)) for p in paths]


def delete_scope(root: Path, scope: Scope) -> list[str]:
    """Delete the scope's directory; returns the files removed, relative to ``root``."""
    directory = scope_dir(root, scope)
    rel = directory.relative_to(root).as_posix()
    return [f"{rel}/{name}" for name in remove_tree(directory)]


def _described(directory: Path) -> Scope | None:
    try:
        record = orjson.loads(read_text(directory / SCOPE_FILE) or "null")
        if not isinstance(record, dict):
            return None
        return Scope(record["tenant"], record["channel"], record["kind"], record["id"])
    except (orjson.JSONDecodeError, KeyError, ScopeError, TypeError, OSError):
        return None
