"""Every file of the project that README.md and docs/*.md name by its path exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = {"data", "build", "dist", "test-output"}
"""Folders a checkout gains by running it (``make run`` makes ``data/``), never the project's."""
TOP = {path.name for path in ROOT.iterdir()
       if path.is_dir() and not path.name.startswith(".") and path.name not in RUNTIME}
PATH = re.compile(
    r"(?<![\w./<>:*{-])((?:[\w-]+/)+[\w.-]*\w\.(?:py|md|toml|js|css|html|ya?ml|cfg|service|sh))"
    r"(?![\w/])")
"""A relative path with a file name: ``gateway/agent/call.py``, ``deploy/gateway.service``.
Paths inside a URL, a placeholder (``channels/<platform>/``) or a glob are not names of
files."""


def named_paths(text: str) -> list[str]:
    """The paths ``text`` names in the project's own folders (``data/``, ``tenants/<T>/`` and
    other runtime places are not in the repository)."""
    return [path for path in PATH.findall(text) if path.split("/")[0] in TOP]


def test_the_pattern_finds_the_paths_a_document_names() -> None:
    """The scan sees plain, backticked and diagram paths, and skips URLs and placeholders."""
    text = ("called in `gateway/agent/call.py`; -> gateway/delivery/router.py  owed\n"
            "see https://example.com/gateway/x.py, channels/<platform>/adapter.py, "
            "data/persona/SOUL.md and deploy/gateway.service")
    assert named_paths(text) == ["gateway/agent/call.py", "gateway/delivery/router.py",
                                 "deploy/gateway.service"]


def test_every_path_named_in_the_docs_exists() -> None:
    """A renamed or moved module leaves no document pointing at a file that is gone."""
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    named = {(doc.relative_to(ROOT).as_posix(), path)
             for doc in documents for path in named_paths(doc.read_text())}
    assert len(named) > 50  # the architecture alone names dozens: the scan reads them
    assert sorted((doc, path) for doc, path in named if not (ROOT / path).exists()) == []
