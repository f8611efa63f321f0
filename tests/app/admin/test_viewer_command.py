"""``gateway viewer``: refusals as one line and exit 2; a real process serving the pages."""

from __future__ import annotations

import asyncio
import gzip
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from app.cli import main
from tests.app.admin.helpers import TOKEN, raw_session
from tests.waiting import WAIT

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No .env from the repository and no admin token from the environment."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GATEWAY_ADMIN_TOKEN", raising=False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--host", "0.0.0.0"], "GATEWAY_ADMIN_TOKEN is not set"),
        (["--tenant", "../x"], "tenant '../x' is not allowed"),
        (["--port", "70000"], "is not a port number"),
    ],
)
def test_refusals_are_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          args: list[str], message: str) -> None:
    """A public bind without a token, a bad tenant or port: one line on stderr, exit 2."""
    code = main(["viewer", "--data-dir", str(tmp_path), *args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("gateway viewer: ")
    assert message in err
    assert err.count("\n") == 1


def test_missing_data_dir_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A data directory that does not exist is an error, not an empty viewer."""
    code = main(["viewer", "--data-dir", str(tmp_path / "nope"), "--port", "0"])
    assert code == 2
    assert "no such data directory" in capsys.readouterr().err


@asynccontextmanager
async def viewer_process(data_dir: Path, *args: str, token: str | None = None
                         ) -> AsyncIterator[str]:
    """Run ``python -m gateway viewer`` on port 0; yield its base URL; stop it with SIGINT."""
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_ADMIN_TOKEN"}
    env["PYTHONPATH"] = str(ROOT)
    if token is not None:
        env["GATEWAY_ADMIN_TOKEN"] = token
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "viewer", "--data-dir", str(data_dir), "--port", "0",
        *args, cwd=data_dir, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        # WAIT, not less: a Python start with aiohttp takes seconds on a loaded machine.
        line = (await asyncio.wait_for(proc.stdout.readline(), WAIT)).decode()
        assert line.startswith("viewer on http://127.0.0.1:"), line
        yield line.split()[2].removesuffix("/admin/")
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        try:
            code = await asyncio.wait_for(proc.wait(), WAIT)
        except TimeoutError:
            proc.kill()  # never leave a viewer behind a failed test
            await proc.wait()
            raise
        assert code == 0


async def test_viewer_process_serves_the_list_and_stops_on_sigint(tmp_path: Path) -> None:
    """On loopback with no token the process serves the list; SIGINT ends it with exit 0."""
    raw_session(tmp_path, "s1", first="hello from the log")
    async with viewer_process(tmp_path) as base, aiohttp.ClientSession() as http, \
            http.get(base + "/") as resp:
        assert resp.status == 200
        assert str(resp.url).endswith("/admin/")
        assert "hello from the log" in await resp.text()


async def test_viewer_process_with_token_asks_for_it(tmp_path: Path) -> None:
    """With GATEWAY_ADMIN_TOKEN set the viewer asks for it even on loopback."""
    raw_session(tmp_path, "s1")
    async with viewer_process(tmp_path, token=TOKEN) as base, aiohttp.ClientSession() as http:
        async with http.get(base + "/admin/") as resp:
            assert resp.status == 401
        async with http.get(base + "/admin/",
                            headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
            assert resp.status == 200


async def test_viewer_process_refuses_compressed_bodies(tmp_path: Path) -> None:
    """The standalone viewer, like the gateway, answers a gzip body 415 without inflating it."""
    raw_session(tmp_path, "s1")
    body = gzip.compress(b"token=" + b"x" * (4 * 1024 * 1024))
    async with viewer_process(tmp_path, token=TOKEN) as base, aiohttp.ClientSession() as http, \
            http.post(base + "/admin/login", data=body, headers={
                "Content-Encoding": "gzip",
                "Content-Type": "application/x-www-form-urlencoded"}) as resp:
        assert resp.status == 415
