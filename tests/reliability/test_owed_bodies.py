"""The crash trials read the owed journal as the next start will: what it still owes."""

from __future__ import annotations

from pathlib import Path

from coordination.journal import FileJournal
from tests.reliability.crash_harness import owed_bodies


async def test_owed_bodies_are_what_the_journal_still_owes(tmp_path: Path) -> None:
    journal = FileJournal(tmp_path / "state" / "delivery.jsonl")
    await journal.open()
    await journal.owe("i1", "c", "k1", '{"text": "hey tok00001"}')
    await journal.owe("i2", "c", "k2", '{"text": "hey tok00002"}')
    await journal.owe("i3", "c", "k3", '{"text": "hey tok00003"}')
    await journal.paid("i1", "s1")
    await journal.drop("i3")
    journal.close()
    assert owed_bodies(tmp_path) == ['{"text": "hey tok00002"}']
    assert owed_bodies(tmp_path / "elsewhere") == []
