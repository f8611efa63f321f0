"""The rewrite's file operations: a new file discarded is removed only while its name is still
that file's (an abandoned rewrite is discarded late, after another may have made its own)."""

from __future__ import annotations

import os
from pathlib import Path

from coordination import journal_file


def test_discard_removes_its_own_new_file(tmp_path: Path) -> None:
    tmp = journal_file.temp_path(tmp_path / "delivery.jsonl")
    fd = journal_file.write_new(tmp, b'["seen"]\n', os.fsync)
    journal_file.discard(fd, tmp)
    assert not tmp.exists()


def test_discard_leaves_a_newer_file_under_the_same_name(tmp_path: Path) -> None:
    tmp = journal_file.temp_path(tmp_path / "delivery.jsonl")
    fd = journal_file.write_new(tmp, b"old\n", os.fsync)
    tmp.unlink()  # the name moved on meanwhile (another rewrite installed its file)
    other = journal_file.write_new(tmp, b"other\n", os.fsync)  # another file, same name
    journal_file.discard(fd, tmp)
    assert tmp.read_bytes() == b"other\n"
    journal_file.discard(other, tmp)
    assert not tmp.exists()
