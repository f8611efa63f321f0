"""``gateway prune`` applies the configured retention once: per tenant, sessions whose last
entry is older go (a dry run only names them), then the files no session refers to; with no
retention set it says there is nothing to do."""

from __future__ import annotations

import asyncio
import io
import os
import time
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from app.cli import main
from sessions.jsonl import JsonlSessionStore
from sessions.retention import DAY
from tests.sessions.helpers import add, user


async def sessions_aged(data_dir: Path, ages: dict[tuple[str, str], float]) -> None:
    store = JsonlSessionStore(data_dir, durability="none")
    for (tenant, name), days in ages.items():
        writer = await store.create(tenant=tenant, channel="web", conversation=name,
                                    session_id=f"20260101-000000-{name}")
        await add(writer, user("hi"))
        await writer.aclose()
        when = time.time() - days * DAY
        os.utime(store.path_of(tenant, writer.session_id), (when, when))


def prune(data_dir: Path, *extra: str) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["prune", "--data-dir", str(data_dir), *extra]) == 0
    return out.getvalue()


def left(data_dir: Path) -> set[str]:
    store = JsonlSessionStore(data_dir, durability="none")
    return {i.conversation or "" for i in asyncio.run(store.list_sessions())}


def test_prune_applies_each_tenants_retention(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """GATEWAY_RETENTION_DAYS=10 and T1=2: the 20-day-old default session and the 3-day-old
    T1 one go, the 5-day-old default one stays; the dry run before removes nothing."""
    asyncio.run(sessions_aged(tmp_path, {("default", "aaa"): 20, ("default", "bbb"): 5,
                                         ("T1", "ccc"): 3}))
    monkeypatch.setenv("GATEWAY_RETENTION_DAYS", "10")
    monkeypatch.setenv("GATEWAY_RETENTION_TENANTS", "T1=2")
    dry = prune(tmp_path, "--dry-run")
    assert "would remove default/20260101-000000-aaa" in dry
    assert "would remove T1/20260101-000000-ccc" in dry
    assert "would remove 2 session(s)" in dry
    assert left(tmp_path) == {"aaa", "bbb", "ccc"}
    done = prune(tmp_path)
    assert "removed 2 session(s)" in done
    assert left(tmp_path) == {"bbb"}


def test_without_retention_nothing_is_done(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """No GATEWAY_RETENTION_DAYS: every session stays, and the command says why."""
    asyncio.run(sessions_aged(tmp_path, {("default", "aaa"): 2000}))
    monkeypatch.delenv("GATEWAY_RETENTION_DAYS", raising=False)
    assert "nothing to do" in prune(tmp_path)
    assert left(tmp_path) == {"aaa"}
