"""Pairing as the running gateway sees it: decided from memory, written behind in a thread,
capped, and still in step with ``gateway pairing`` (another process) through the file."""

from __future__ import annotations

import asyncio
import logging
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from coordination.file_pairing import FilePairingState
from gateway.access.pairing_live import LivePairing
from gateway.edge.pairing import MAX_PENDING, PairingStore
from tests.channels.test_telegram_harness import running, settled, telegram_settings, wait_until
from tests.fakes.telegram_api import FakeTelegramServer
from tests.waiting import WAIT

T = TypeVar("T")


class Recorded(FilePairingState):
    """The pairing file, recording which thread every read and update ran on."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.threads: list[tuple[str, int]] = []

    def read(self) -> dict[str, Any]:
        self.threads.append(("read", threading.get_ident()))
        return super().read()

    def update(self, change: Callable[[dict[str, Any]], T]) -> T:
        self.threads.append(("update", threading.get_ident()))
        return super().update(change)


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[Recorded]:
    """Every pairing file the gateway opens (through ``FilePairingState.under``) is recorded."""
    made: list[Recorded] = []

    def under(cls: type[FilePairingState], data_dir: Path) -> Recorded:
        state = Recorded(data_dir / "access" / "pairing.json")
        made.append(state)
        return state

    monkeypatch.setattr(FilePairingState, "under", classmethod(under))
    return made


async def test_the_event_loop_never_touches_the_pairing_file(
    tmp_path: Path, recorded: list[Recorded]
) -> None:
    """40 strangers' DMs and a paired person's messages through a running gateway: every read
    and write of the pairing file happens in a worker thread, none on the event loop."""
    PairingStore(FilePairingState(tmp_path / "access" / "pairing.json")).state.update(
        lambda d: d.setdefault("approved", {}).update({"telegram:555": {"name": "P"}}))
    async with FakeTelegramServer() as fake:
        settings = telegram_settings(fake, tmp_path, TELEGRAM_ALLOWED_USERS="1")
        async with running(settings) as gateway:
            loop_thread = threading.get_ident()
            for n in range(40):
                fake.user_message(9000 + n, "hello?")
            for n in range(3):
                fake.user_message(555, f"paired {n}")
            await settled(gateway, 3)
            await wait_until(lambda: sum(len(fake.texts_to(9000 + n)) for n in range(40)) == 40)
    [state] = recorded
    assert ("update", loop_thread) not in state.threads
    assert ("read", loop_thread) not in state.threads
    assert any(kind == "update" for kind, _ in state.threads)  # codes were written
    pending = PairingStore(FilePairingState(state.path)).listing()["pending"]
    assert sorted(p["user"] for p in pending.values()) == sorted(str(9000 + n) for n in range(40))
    assert stat.S_IMODE(state.path.stat().st_mode) == 0o600


async def test_pending_codes_are_capped_oldest_first(tmp_path: Path) -> None:
    """Past MAX_PENDING strangers the oldest codes go first, in memory and on file; a person
    asking again keeps their one live code."""
    now = [1000.0]
    path = tmp_path / "pairing.json"
    async with LivePairing(FilePairingState(path), clock=lambda: now[0]) as live:
        codes = []
        for n in range(MAX_PENDING + 10):
            now[0] += 1
            codes.append(await live.check("telegram", f"u{n}", None))
        again = await live.check("telegram", f"u{MAX_PENDING + 9}", None)
    on_file = PairingStore(FilePairingState(path), clock=lambda: now[0]).listing()["pending"]
    assert again == codes[-1]
    assert len(set(codes)) == len(codes)
    assert sorted(on_file) == sorted(codes[10:])
    assert sorted(live.store.listing()["pending"]) == sorted(codes[10:])


async def test_approvals_and_revocations_made_elsewhere_reach_the_gateway(tmp_path: Path) -> None:
    """An approval by ``gateway pairing`` (another PairingStore on the file) lets the person in
    on their next message; a revocation applies at the next refresh."""
    path = tmp_path / "pairing.json"
    operator = PairingStore(FilePairingState(path))
    async with LivePairing(FilePairingState(path), refresh=0.05) as live:
        code = await live.check("slack", "U7", "Ann")
        assert code is not None
        operator.approve(code)  # the code is on file before the person is told it
        assert await live.check("slack", "U7", "Ann") is None
        assert live.is_approved("slack", "U7")
        operator.revoke("slack", "U7")
        await wait_until(lambda: not live.is_approved("slack", "U7"), timeout=WAIT)


class Flaky(FilePairingState):
    """The pairing file, failing its first ``failures`` updates (a full disk, say)."""

    def __init__(self, path: Path, failures: int) -> None:
        super().__init__(path)
        self.failures = failures

    def update(self, change: Callable[[dict[str, Any]], T]) -> T:
        if self.failures > 0:
            self.failures -= 1
            raise OSError(28, "No space left on device")
        return super().update(change)


async def test_codes_survive_a_failing_state_and_are_written_once_it_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Codes given while the real state fails stay in memory, are written once it works again,
    and the failure episode is logged once."""
    caplog.set_level(logging.INFO, logger="gateway.access.pairing_live")
    path = tmp_path / "pairing.json"
    flaky = Flaky(path, failures=2)
    on_file = PairingStore(FilePairingState(path))
    async with LivePairing(flaky, refresh=0.05, retry=0.05) as live:
        first = asyncio.create_task(live.check("telegram", "1", None))
        second = asyncio.create_task(live.check("telegram", "2", None))
        codes = await asyncio.wait_for(asyncio.gather(first, second), timeout=WAIT)
        assert None not in codes
        await wait_until(lambda: len(on_file.listing()["pending"]) == 2)
        assert live.memory.queued == []
    assert sorted(on_file.listing()["pending"]) == sorted(c for c in codes if c is not None)
    lines = [r.getMessage() for r in caplog.records if r.name == "gateway.access.pairing_live"]
    assert [line.split(":")[0] for line in lines] == ["pairing state", "pairing state"]
    assert "cannot write or read it (OSError)" in lines[0]
    assert "recovered" in lines[1]
