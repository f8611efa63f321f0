"""`gateway pairing`: list, approve, revoke, and the lockout after bad codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli import main
from coordination.file_pairing import FilePairingState
from gateway.edge.pairing import MAX_BAD_ATTEMPTS, PairingStore


def test_approve_list_revoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A pending code is listed, approving it approves the user, revoke removes them."""
    store = PairingStore(FilePairingState.under(tmp_path))
    code = store.request("telegram", "42", "Ada")
    assert main(["pairing", "--data-dir", str(tmp_path), "list"]) == 0
    assert f"{code}  telegram:42 (Ada)" in capsys.readouterr().out
    assert main(["pairing", "--data-dir", str(tmp_path), "approve", code.lower()]) == 0
    assert store.is_approved("telegram", "42")
    assert main(["pairing", "--data-dir", str(tmp_path), "revoke", "telegram:42"]) == 0
    assert not store.is_approved("telegram", "42")
    assert (tmp_path / "access" / "pairing.json").stat().st_mode & 0o777 == 0o600


def test_bad_codes_lock_approval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Five wrong codes lock approval, even for a valid code, with a one-line error."""
    store = PairingStore(FilePairingState.under(tmp_path))
    code = store.request("slack", "U1", None)
    for _ in range(MAX_BAD_ATTEMPTS):
        assert main(["pairing", "--data-dir", str(tmp_path), "approve", "WRONG123"]) == 2
    assert main(["pairing", "--data-dir", str(tmp_path), "approve", code]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("gateway pairing: too many bad codes")
    assert not store.is_approved("slack", "U1")


def test_expired_code_cannot_be_approved(tmp_path: Path) -> None:
    """A code older than an hour is gone."""
    now = [1000.0]
    store = PairingStore(FilePairingState.under(tmp_path), clock=lambda: now[0])
    code = store.request("telegram", "7", None)
    now[0] += 3601
    with pytest.raises(Exception, match="no such pending code"):
        store.approve(code)


def test_data_dir_after_the_action(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`gateway pairing list --data-dir D` (the option after the action, as the README and
    every other command put it) reads D; before the action it still works, and one given
    before is not undone by the action's own default."""
    store = PairingStore(FilePairingState.under(tmp_path))
    code = store.request("telegram", "42", "Ada")
    assert main(["pairing", "list", "--data-dir", str(tmp_path)]) == 0
    assert f"{code}  telegram:42 (Ada)" in capsys.readouterr().out
    assert main(["pairing", "--data-dir", str(tmp_path), "list"]) == 0
    assert f"{code}  telegram:42 (Ada)" in capsys.readouterr().out
    assert main(["pairing", "approve", code, "--data-dir", str(tmp_path)]) == 0
    assert store.is_approved("telegram", "42")
