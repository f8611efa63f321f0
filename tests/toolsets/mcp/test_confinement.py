"""Where a stdio MCP server runs and what it can leave behind: a private working directory
and HOME (never the gateway's, where the .env is), the SDK's short environment, a stderr log
capped and rotated, and answers read only up to the message limit."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from tests.toolsets.mcp.harness import REPO, eventually
from tests.toolsets.mcp.test_connection import call, toolbox
from toolsets.mcp.logs import KEEP, MAX_LOG_BYTES, log_files
from toolsets.mcp.stdio import TOO_LONG, _Lines


def confined_spec() -> dict[str, object]:
    """The confinement test server with no ``cwd`` of its own (it finds our code by
    PYTHONPATH)."""
    return {"command": sys.executable, "args": ["-m", "tests.toolsets.mcp.confined_server"],
            "env": {"PYTHONPATH": str(REPO)}}


async def test_a_stdio_server_runs_in_a_private_directory_of_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Started from a gateway whose working directory holds a .env with a key, the server's
    working directory is its own 0700 directory (also its HOME), outside the checkout and the
    gateway's directory; the .env is not there to read; the gateway's secrets are not in its
    environment; the directory is removed when the gateway stops."""
    gateway_dir = tmp_path / "gateway"
    gateway_dir.mkdir()
    (gateway_dir / ".env").write_text("ANTHROPIC_API_KEY=sk-very-secret\n")
    monkeypatch.chdir(gateway_dir)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-very-secret")
    async with toolbox({"t": confined_spec()}) as box:
        kind, text = await call(box, "t__where")
        cwd, home, names = text.split("\n")
        mode = stat.S_IMODE(os.stat(cwd).st_mode)
        dotenv = await call(box, "t__read_file", {"path": ".env"})
    assert kind == "ok"
    assert cwd == home
    assert place(cwd, gateway_dir) == ("elsewhere", "outside the checkout", "gone")
    assert mode == 0o700
    assert dotenv[0] == "error"
    assert "ANTHROPIC_API_KEY" not in names.split()


def same_place(a: str, b: Path) -> bool:
    return Path(a).resolve() == b.resolve()


def place(cwd: str, gateway_dir: Path) -> tuple[str, str, str]:
    """Where a server's directory was, seen after the gateway stopped."""
    found = Path(cwd).resolve()
    return ("the gateway's" if found == gateway_dir.resolve() else "elsewhere",
            "in the checkout" if found.is_relative_to(REPO) else "outside the checkout",
            "left behind" if found.exists() else "gone")


async def test_an_entry_that_names_its_cwd_and_home_keeps_them(tmp_path: Path) -> None:
    """``cwd`` and ``env.HOME`` in a server's entry are the operator's choice and win."""
    spec = {**confined_spec(), "cwd": str(tmp_path),
            "env": {"PYTHONPATH": str(REPO), "HOME": str(tmp_path / "home")}}
    async with toolbox({"t": spec}) as box:
        _, text = await call(box, "t__where")
    cwd, home, _ = text.split("\n")
    assert (same_place(cwd, tmp_path), home) == (True, str(tmp_path / "home"))


async def test_stderr_is_capped_and_rotated(tmp_path: Path) -> None:
    """A server that writes four times the cap to stderr leaves the current log and KEEP
    rotated ones, none over the cap, the newest lines in the current one; nothing more."""
    logs = tmp_path / "mcp-logs"
    async with toolbox({"t": confined_spec()}, log_dir=logs) as box:
        for n in range(4):
            assert await call(box, "t__noise", {"size": MAX_LOG_BYTES - 4096,
                                                "marker": f"END-{n}"}) == ("ok", "written")
        await eventually(lambda: b"END-3" in (logs / "t.log").read_bytes())
        files = log_files(logs, "t")
        sizes = [path.stat().st_size for path in files]
        names = sorted(path.name for path in logs.iterdir())
    assert names == ["t.log", *(f"t.log.{n}" for n in range(1, KEEP + 1))]
    assert [path.name for path in files] == ["t.log", "t.log.1", "t.log.2"]
    assert all(0 < size <= MAX_LOG_BYTES for size in sizes)
    assert stat.S_IMODE((logs / "t.log").stat().st_mode) == 0o600


async def test_an_answer_past_the_message_limit_is_not_read(tmp_path: Path) -> None:
    """A result of 2 MB against a 256 KiB message limit is a tool error saying it was not
    read; the server answers the next call as usual."""
    async with toolbox({"t": confined_spec()}, max_message_bytes=256 * 1024) as box:
        kind, text = await call(box, "t__big", {"size": 2_000_000})
        after = await call(box, "t__lookup", {"key": "abc"})
    assert kind == "error"
    assert "over 262,144 bytes (not read)" in text
    assert after == ("ok", "abc is here")


def test_the_reader_never_holds_more_than_the_limit_of_one_message() -> None:
    """Fed 10 MB of one message in 64 KiB pieces, the reader holds at most the limit plus a
    piece, then answers its id with an error; the next message is read whole."""
    lines = _Lines(100_000)
    head = b'{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"'
    pieces = [head] + [b"x" * 65536] * 160 + [b'"}]}}\n{"jsonrpc":"2.0","id":8,"result":{}}\n']
    out = []
    held = 0
    for piece in pieces:
        out.extend(lines.feed(piece))
        held = max(held, len(lines.buffer))
    assert held <= 100_000 + 65536
    first, second = (message.message for message in out)  # type: ignore[union-attr]
    assert (first.id, first.error.code) == (7, TOO_LONG)  # type: ignore[union-attr]
    assert second.id == 8
