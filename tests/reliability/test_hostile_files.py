"""Hostile entries in the data folder and the operator tools: a bad file is skipped and
reported, never a 500, a traceback, a hang or an unbounded read.

What an attacker (or an accident) can leave in ``<data>/sessions/`` under a ``*.jsonl`` name:
a first line that is JSON but no object (``[1]``, ``42``), a directory, a dangling symlink, a
FIFO (opening it for reading waits for a writer forever), a symlink to ``/dev/zero`` (a read
that never ends). Each is tried against the gateway's web API (which builds the tenant's header
index) and against ``gateway replay``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from app.cli import main as cli_main
from sessions.jsonl import session_info
from sessions.replay import replay_bytes
from tests.reliability.support import web_gateway, web_settings

HANG_LIMIT = 20.0
"""Seconds a command may take before it counts as hung (it takes milliseconds)."""


def plant(folder: Path) -> dict[str, str]:
    """Every kind of bad entry, by file name -> what it is."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "array.jsonl").write_bytes(b"[1]\n")
    (folder / "scalar.jsonl").write_bytes(b"42\n")
    (folder / "isdir.jsonl").mkdir()
    (folder / "dangling.jsonl").symlink_to(folder / "nowhere")
    os.mkfifo(folder / "fifo.jsonl")
    (folder / "zero.jsonl").symlink_to("/dev/zero")
    return {"array.jsonl": "array", "scalar.jsonl": "scalar", "isdir.jsonl": "directory",
            "dangling.jsonl": "dangling symlink", "fifo.jsonl": "FIFO",
            "zero.jsonl": "symlink to /dev/zero"}


@contextlib.contextmanager
def fifos_released(folder: Path) -> Iterator[None]:
    """On the way out, open every FIFO in ``folder`` for writing once: a reader the code under
    test wrongly left blocked in ``open`` then gets EOF, so a failing test ends instead of
    hanging the run."""
    try:
        yield
    finally:
        for path in folder.glob("*"):
            if stat.S_ISFIFO(path.lstat().st_mode):
                with contextlib.suppress(OSError):
                    os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def run_cli(argv: list[str]) -> int:
    """The ``gateway`` command in a thread, bounded in time (a hang is a failure, not a stuck
    run); its exit code."""
    result: list[int] = []

    def target() -> None:
        try:
            result.append(cli_main(argv))
        except SystemExit as exc:
            result.append(int(exc.code or 0))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(HANG_LIMIT)
    assert result, f"gateway {' '.join(argv)} did not finish in {HANG_LIMIT} s"
    return result[0]


# -- the gateway: one bad file must not break a tenant -------------------------------------------


async def test_bad_files_do_not_break_chat_or_history(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With every kind of bad file in the sessions folder, /api/chat and /api/history answer
    200 on every request, and each bad file is reported once (by name and reason)."""
    data_dir = tmp_path / "data"
    folder = data_dir / "tenants" / "web" / "sessions"  # the web chat's tenant
    planted = plant(folder)
    caplog.set_level(logging.WARNING, logger="sessions")
    with fifos_released(folder):
        async with web_gateway(web_settings(data_dir)) as web:
            statuses = []
            for n in range(3):
                status, body = await web.chat(f"c{n}", "hello")
                statuses.append(("chat", status, "reply" in body))
                async with web.http.get(f"{web.base}/api/history?conversation=c{n}") as resp:
                    statuses.append(("history", resp.status, (await resp.json())["total"] == 2))
    assert statuses == [("chat", 200, True), ("history", 200, True)] * 3
    reports = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert sorted(name for name in planted if any(repr(name) in m for m in reports)) \
        == sorted(planted)
    assert len(reports) == len(planted)


# -- gateway replay -------------------------------------------------------------------------------


def test_replay_list_shows_bad_entries_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``replay --list`` lists every bad entry with its reason, no traceback, no hang."""
    folder = tmp_path / "sessions"
    planted = plant(folder)
    with fifos_released(folder):
        code = run_cli(["replay", "--list", "--json", "--data-dir", str(tmp_path)])
    captured = capsys.readouterr()
    assert (code, captured.err) == (0, "")
    rows = {row["id"]: row["error"] for row in orjson.loads(captured.out)}
    assert sorted(rows) == sorted(name.removesuffix(".jsonl") for name in planted)
    assert rows["isdir"] == "a directory, not a regular file"
    assert rows["fifo"] == "a FIFO, not a regular file"
    assert rows["dangling"] == rows["zero"] == "a symlink, not a regular file"
    assert rows["array"] == rows["scalar"] == "no readable header"


@pytest.mark.parametrize("name", ["isdir", "dangling", "fifo", "zero", "array", "scalar"])
def test_replay_of_a_bad_entry_is_one_line_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """``replay <id>`` and ``replay <path>`` of a bad entry: one stderr line, exit 1 (a
    dangling path is "no such file", exit 2), never a hang or an endless read."""
    folder = tmp_path / "sessions"
    plant(folder)
    with fifos_released(folder):
        by_id = run_cli(["replay", name, "--data-dir", str(tmp_path)])
        by_path = run_cli(["replay", str(folder / f"{name}.jsonl")])
    err = capsys.readouterr().err
    assert (by_id, by_path) == (1, 2 if name == "dangling" else 1)
    assert len(err.splitlines()) == 2, err
    assert all(line.startswith("gateway replay: ") for line in err.splitlines()), err


def test_a_file_gone_between_listing_and_stat_is_left_out(tmp_path: Path) -> None:
    """A session deleted after the folder was listed (``sessions prune`` running at the same
    time) is left out of the listing, not a traceback."""
    assert session_info(tmp_path / "gone.jsonl", "default") is None


# -- torn means unterminated ---------------------------------------------------------------------

BAD_LAST_LINES = {
    "invalid UTF-8": b'{"type":"message","seq":1,"text":"\xff\xfe"}',
    "deep nesting": b"[" * 200_000 + b"]" * 200_000,
    "lone surrogate": b'{"type":"message","seq":1,"text":"\\ud800"}',
}
HEADER = (b'{"type":"session","seq":0,"ts":"2026-01-01T00:00:00.000Z","version":3,"id":"s",'
          b'"startedAt":"2026-01-01T00:00:00.000Z","channel":"web","conversation":"c"}\n')


@pytest.mark.parametrize("label", list(BAD_LAST_LINES))
def test_a_terminated_bad_last_line_is_a_problem_not_torn(label: str) -> None:
    """A newline-terminated last line that does not parse is a problem with its line number;
    the same bytes without the newline are a torn tail."""
    line = BAD_LAST_LINES[label]
    whole = replay_bytes(HEADER + line + b"\n")
    assert (whole.torn_tail, [(p.line, p.message) for p in whole.problems]) \
        == (False, [(2, "not valid JSON")])
    cut = replay_bytes(HEADER + line)
    assert (cut.torn_tail, cut.problems) == (True, ())


# -- export files ----------------------------------------------------------------


def test_export_files_are_created_0600(tmp_path: Path) -> None:
    """``export --out FILE`` writes FILE 0600 whatever the umask, tightens an existing 0644
    FILE, and keeps the ``--all`` checkpoint 0600 too."""
    data_dir = tmp_path / "data"
    folder = data_dir / "sessions"
    folder.mkdir(parents=True)
    (folder / "s.jsonl").write_bytes(HEADER)
    (folder / "bad.jsonl").write_bytes(b"[1]\n")  # unreadable: --all keeps its checkpoint
    one, loose, every = tmp_path / "one.jsonl", tmp_path / "loose.jsonl", tmp_path / "all.jsonl"
    loose.write_bytes(b"old")
    loose.chmod(0o644)
    old_umask = os.umask(0o022)
    try:
        codes = [run_cli(["export", "s", "--format", "jsonl", "--out", str(path),
                          "--data-dir", str(data_dir)]) for path in (one, loose)]
        codes.append(run_cli(["export", "--all", "--format", "otlp-json", "--out", str(every),
                              "--data-dir", str(data_dir)]))
    finally:
        os.umask(old_umask)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode)
             for p in (one, loose, every, every.with_name("all.jsonl.progress"))}
    assert codes == [0, 0, 1]
    assert modes == dict.fromkeys(modes, 0o600)
