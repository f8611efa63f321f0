"""``gateway sessions prune|size``: age by mtime, dry runs, symlinks and locks, size numbers."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from app.cli import main
from sessions.jsonl import JsonlSessionStore
from tests.sessions.helpers import add, user

DAY = 86_400
NOW = time.time()
# (tenant, id, age in days)
LAYOUT = [
    ("default", "old1", 40), ("default", "old2", 31), ("default", "new1", 2),
    ("acme", "old3", 90), ("acme", "new2", 0),
]


@dataclass(frozen=True)
class Result:
    code: int | str | None
    out: str
    err: str


def session_path(root: Path, tenant: str, sid: str) -> Path:
    base = root if tenant == "default" else root / "tenants" / tenant
    return base / "sessions" / f"{sid}.jsonl"


def age(path: Path, days: float) -> float:
    """Set the file's mtime (and atime) ``days`` ago; return that mtime."""
    mtime = NOW - days * DAY
    os.utime(path, (mtime, mtime))
    return mtime


async def _build(root: Path) -> None:
    store = JsonlSessionStore(root, durability="none")
    for tenant, sid, _ in LAYOUT:
        writer = await store.create(tenant=tenant, channel="console", conversation=sid,
                                    session_id=sid)
        await add(writer, user(f"hello from {sid}"))
        await writer.aclose()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    asyncio.run(_build(data))
    for tenant, sid, days in LAYOUT:
        age(session_path(data, tenant, sid), days)
    return data


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], root: Path) -> Callable[..., Result]:
    """``gateway sessions <action> --data-dir <root> <args>`` through ``app.cli.main``."""
    def run(action: str, *argv: str) -> Result:
        try:
            code: int | str | None = main(["sessions", action, "--data-dir", str(root), *argv])
        except SystemExit as exc:  # argparse usage errors exit this way, as from the shell
            code = exc.code
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return run


def existing(root: Path) -> set[str]:
    return {f"{t}/{s}" for t, s, _ in LAYOUT if session_path(root, t, s).exists()}


def size_of(root: Path, *names: tuple[str, str]) -> int:
    return sum(session_path(root, t, s).stat().st_size for t, s in names)


def iso(days: float) -> str:
    return datetime.fromtimestamp(NOW - days * DAY, UTC).isoformat(timespec="seconds").replace(
        "+00:00", "Z")


def test_dry_run_lists_but_deletes_nothing(cli: Callable[..., Result], root: Path) -> None:
    """--dry-run names every old session with its size and totals; every file is still there."""
    before = existing(root)
    result = cli("prune", "--older-than", "30d", "--dry-run")
    assert (result.code, result.err) == (0, "")
    total = size_of(root, ("default", "old1"), ("default", "old2"), ("acme", "old3"))
    assert result.out.splitlines() == [
        f"would remove default/old1  {size_of(root, ('default', 'old1'))} bytes  "
        f"last modified {iso(40)}",
        f"would remove default/old2  {size_of(root, ('default', 'old2'))} bytes  "
        f"last modified {iso(31)}",
        f"would remove acme/old3  {size_of(root, ('acme', 'old3'))} bytes  "
        f"last modified {iso(90)}",
        f"would remove 3 session(s), {total} bytes",
    ]
    assert existing(root) == before == {"default/old1", "default/old2", "default/new1",
                                        "acme/old3", "acme/new2"}


def test_prune_deletes_only_old_sessions(cli: Callable[..., Result], root: Path) -> None:
    """A real prune removes the sessions older than the age and keeps the rest."""
    total = size_of(root, ("default", "old1"), ("default", "old2"), ("acme", "old3"))
    result = cli("prune", "--older-than", "30d")
    assert result.code == 0
    assert [line.split()[:2] for line in result.out.splitlines()[:-1]] == [
        ["removed", "default/old1"], ["removed", "default/old2"], ["removed", "acme/old3"],
    ]
    assert result.out.splitlines()[-1] == f"removed 3 session(s), {total} bytes"
    assert existing(root) == {"default/new1", "acme/new2"}


@pytest.mark.parametrize(
    ("older_than", "left"),
    [("35d", {"default/old2", "default/new1", "acme/new2"}),
     ("1h", {"acme/new2"}),
     (f"{91 * 24}h", {"default/old1", "default/old2", "default/new1", "acme/old3", "acme/new2"}),
     (f"{3 * DAY}s", {"acme/new2", "default/new1"}),
     (f"{45 * 24 * 60}m", {"default/old1", "default/old2", "default/new1", "acme/new2"})],
)
def test_units(cli: Callable[..., Result], root: Path, older_than: str, left: set[str]) -> None:
    """s, m, h and d units all measure the same age."""
    assert cli("prune", "--older-than", older_than).code == 0
    assert existing(root) == left


def test_prune_one_tenant(cli: Callable[..., Result], root: Path) -> None:
    """--tenant limits the prune to that tenant."""
    result = cli("prune", "--older-than", "30d", "--tenant", "acme")
    assert result.out.splitlines()[0].startswith("removed acme/old3  ")
    assert existing(root) == {"default/old1", "default/old2", "default/new1", "acme/new2"}


@pytest.mark.parametrize("bad", ["30", "0d", "-1d", "1.5d", "30x", "d", "", "30 d", "1w"])
def test_nonsense_durations_exit_2(cli: Callable[..., Result], root: Path, bad: str) -> None:
    """A duration that is not a positive whole number with s/m/h/d is one line, exit 2."""
    result = cli("prune", f"--older-than={bad}")  # "=" so "-1d" is not read as an option
    assert (result.code, result.out) == (2, "")
    assert result.err.count("\n") == 1
    assert result.err.startswith("gateway sessions: --older-than")
    assert len(existing(root)) == 5


def test_symlinks_are_never_followed(cli: Callable[..., Result], root: Path,
                                     tmp_path: Path) -> None:
    """A symlinked session file or tenant directory is skipped; its target survives."""
    outside = tmp_path / "outside"
    (outside / "sessions").mkdir(parents=True)
    target = outside / "sessions" / "victim.jsonl"
    target.write_text('{"type":"session"}\n')
    age(target, 100)
    link = root / "sessions" / "link.jsonl"
    link.symlink_to(target)
    os.utime(link, (NOW - 100 * DAY,) * 2, follow_symlinks=False)
    (root / "tenants" / "evil").symlink_to(outside, target_is_directory=True)
    result = cli("prune", "--older-than", "30d")
    assert result.code == 0
    assert "link" not in result.out
    assert "evil" not in result.out
    assert target.exists()
    assert link.is_symlink()
    assert existing(root) == {"default/new1", "acme/new2"}
    size = cli("size")
    assert "evil" not in size.out


def test_other_files_and_bad_names_are_left_alone(cli: Callable[..., Result], root: Path) -> None:
    """Only <valid id>.jsonl regular files are sessions; anything else stays."""
    sessions = root / "sessions"
    stray = [sessions / "notes.txt", sessions / ".hidden.jsonl", sessions / "dir.jsonl"]
    stray[0].write_text("x")
    stray[1].write_text("x")
    stray[2].mkdir()
    for path in stray:
        age(path, 100)
    assert cli("prune", "--older-than", "1d").code == 0
    assert all(p.exists() for p in stray)


async def test_session_open_for_writing_is_kept(root: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """An old session a gateway holds open (its flock) is kept and reported, not deleted."""
    store = JsonlSessionStore(root, durability="none")
    writer = await store.open("default", "old1")
    try:
        age(session_path(root, "default", "old1"), 40)
        code = await asyncio.to_thread(
            main, ["sessions", "prune", "--older-than", "30d", "--data-dir", str(root)])
    finally:
        await writer.aclose()
    out = capsys.readouterr().out
    assert code == 0
    assert "kept default/old1: in use by a running gateway" in out.splitlines()
    assert out.splitlines()[-1].endswith("; kept 1 in use or changed")
    assert existing(root) == {"default/old1", "default/new1", "acme/new2"}


def test_size_report_numbers(cli: Callable[..., Result], root: Path) -> None:
    """size: sessions, bytes, oldest and newest per tenant, and a total line."""
    result = cli("size")
    assert (result.code, result.err) == (0, "")
    default = size_of(root, ("default", "old1"), ("default", "old2"), ("default", "new1"))
    acme = size_of(root, ("acme", "old3"), ("acme", "new2"))
    assert [line.split() for line in result.out.splitlines()] == [
        ["tenant", "sessions", "bytes", "oldest", "newest"],
        ["default", "3", str(default), iso(40), iso(2)],
        ["acme", "2", str(acme), iso(90), iso(0)],
        ["total", "5", str(default + acme)],
    ]
    one = cli("size", "--tenant", "acme")
    assert [line.split()[:3] for line in one.out.splitlines()[1:]] == [
        ["acme", "2", str(acme)], ["total", "2", str(acme)]]


def test_size_of_an_empty_data_dir(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A data directory without sessions reports a zero total."""
    assert main(["sessions", "size", "--data-dir", str(tmp_path / "none")]) == 0
    assert capsys.readouterr().out.splitlines()[-1].split() == ["total", "0", "0"]


def test_bad_tenant_is_a_usage_error(cli: Callable[..., Result]) -> None:
    """An unsafe tenant name is refused before touching the disk."""
    result = cli("prune", "--older-than", "1d", "--tenant", "../x")
    assert (result.code, result.out) == (2, "")
    assert result.err.startswith("gateway sessions: tenant '../x' is not allowed")
