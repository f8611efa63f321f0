"""Pairing state in Redis: a code given by one worker can be approved through another."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.edge.pairing import PairingError, PairingStore
from tests.coordination.harness import coordinator

pytestmark = pytest.mark.services


async def test_pairing_is_shared_by_workers(prefix: str, tmp_path: Path) -> None:
    """A code given on one worker is approved on another; bad codes count across workers."""
    async with coordinator(prefix) as a, coordinator(prefix) as b:
        on_a = PairingStore(a.pairing_state())
        on_b = PairingStore(b.pairing_state())
        code = on_a.request("telegram", "42", "Ann")
        assert on_b.request("telegram", "42", "Ann") == code  # the same pending code
        assert not on_a.is_approved("telegram", "42")
        with pytest.raises(PairingError):
            on_b.approve("WRONGCDE")
        approved = on_b.approve(code.lower())
        assert (approved.channel, approved.user, approved.name) == ("telegram", "42", "Ann")
        assert on_a.is_approved("telegram", "42")
        assert len(on_a.state.read()["bad_attempts"]) == 1
    assert not (tmp_path / "a").exists()
    assert not (tmp_path / "b").exists()


async def test_concurrent_requests_are_all_kept(prefix: str, tmp_path: Path) -> None:
    """Updates from many threads at once (optimistic transactions) lose nobody's code."""
    async with coordinator(prefix) as a, coordinator(prefix) as b:
        stores = [PairingStore(c.pairing_state()) for c in (a, b)]
        codes = await asyncio.gather(*(
            asyncio.to_thread(stores[n % 2].request, "slack", f"U{n}", None) for n in range(20)
        ))
        pending = stores[0].listing()["pending"]
    assert sorted(pending) == sorted(codes)
    assert sorted(p["user"] for p in pending.values()) == sorted(f"U{n}" for n in range(20))


async def test_cli_approval_reaches_the_workers(
    prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gateway pairing approve` with GATEWAY_REDIS_URL set approves in the shared state."""
    from app.cli import main
    from tests.coordination.services import REDIS_URL

    monkeypatch.setenv("GATEWAY_REDIS_URL", REDIS_URL)
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", prefix)
    async with coordinator(prefix) as worker:
        on_worker = PairingStore(worker.pairing_state())
        code = on_worker.request("slack", "U9", None)
        status = await asyncio.to_thread(
            main, ["pairing", "--data-dir", str(tmp_path / "cli"), "approve", code])
        assert status == 0
        assert on_worker.is_approved("slack", "U9")
    assert not (tmp_path / "cli").exists()  # nothing went to a local file


async def test_cli_approval_reads_redis_from_dotenv(
    prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With GATEWAY_REDIS_URL only in .env (as the workers read it), `gateway pairing
    approve` approves in the workers' Redis, never in a local file."""
    from app.cli import main
    from tests.coordination.services import REDIS_URL

    monkeypatch.delenv("GATEWAY_REDIS_URL", raising=False)
    monkeypatch.delenv("GATEWAY_REDIS_PREFIX", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text(
        f"GATEWAY_REDIS_URL={REDIS_URL}\nGATEWAY_REDIS_PREFIX={prefix}\n"
        f"GATEWAY_DATA_DIR={tmp_path / 'cli'}\n")
    async with coordinator(prefix) as worker:
        on_worker = PairingStore(worker.pairing_state())
        code = on_worker.request("telegram", "42", None)
        status = await asyncio.to_thread(main, ["pairing", "approve", code])
        assert status == 0
        assert on_worker.is_approved("telegram", "42")
    assert not (tmp_path / "cli").exists()
