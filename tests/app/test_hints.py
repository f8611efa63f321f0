"""The commands the product prints work as printed: `gateway --help`'s common tasks and a
failure's suggested command are spelled as the operator reaches this `gateway` from the working
directory (`.venv/bin/gateway` after `make run`, `gateway` when PATH finds it, the absolute
path elsewhere), and each spelling runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "gateway"


def run(argv: list[str] | str, cwd: Path,
        path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env["PATH"] = path if path is not None else "/usr/bin:/bin"
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
                          check=False, shell=isinstance(argv, str))


def advertised(help_text: str) -> str:
    """The command `--help` tells the operator to run (its completion line)."""
    found = re.search(r'eval "\$\((.+) completion bash\)"', help_text)
    assert found is not None, help_text
    return found.group(1)


@pytest.mark.parametrize("where", ["project", "elsewhere", "on PATH"])
def test_help_spells_the_command_as_it_runs_here(where: str, tmp_path: Path) -> None:
    """From the project (`.venv/bin/gateway`), from another directory (its absolute path) and
    with the venv on PATH (`gateway`), `--help` names the command as it works there, and the
    name printed runs as printed."""
    if not SCRIPT.is_file():
        pytest.fail(f"no console script beside {sys.executable}: the package is not installed")
    cwd = ROOT if where == "project" else tmp_path
    path = f"{SCRIPT.parent}:/usr/bin:/bin" if where == "on PATH" else None
    shown = run([str(SCRIPT), "--help"], cwd, path)
    assert shown.returncode == 0, shown.stderr
    command = advertised(shown.stdout)
    expected = {"project": os.path.relpath(SCRIPT, ROOT), "elsewhere": str(SCRIPT),
                "on PATH": "gateway"}[where]
    assert command == expected
    assert f"  {command} replay ID --call 2" in shown.stdout
    works = run(f"{command} --version", cwd, path)
    assert (works.returncode, works.stdout.startswith("gateway ")) == (0, True), works.stderr


def test_a_suggested_command_in_a_failure_is_spelled_as_typed(tmp_path: Path) -> None:
    """A one-line failure that suggests a `gateway ...` command names it as it runs here."""
    from app.hints import as_typed, cli_command

    message = as_typed("schema 'x' is at version 0; run `gateway db upgrade`")
    assert message == f"schema 'x' is at version 0; run `{cli_command()} db upgrade`"
    assert as_typed("no command here") == "no command here"


async def test_the_web_pages_replay_hint_works_as_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the shipped web tenant (``web``, not the default tenant), the replay command the
    chat page shows for a session, pasted into a shell, replays that session."""
    import html

    import aiohttp

    from app.compose import build_gateway
    from tests.channels.test_web import settings

    monkeypatch.delenv("GATEWAY_WEB_TENANT", raising=False)  # the shipped default: web
    gateway = build_gateway(settings(tmp_path / "data"))
    await gateway.start()
    base = f"http://127.0.0.1:{gateway.bound_port}"
    try:
        async with aiohttp.ClientSession() as client:
            async with client.get(f"{base}/") as page:
                found = re.search(r'data-command="([^"]*)"', await page.text())
            async with client.post(f"{base}/api/chat", json={
                    "conversation": "c-hint", "text": "hello", "id": "m-1"}) as chat:
                session = (await chat.json())["session"]
    finally:
        await gateway.aclose()
    assert found is not None
    hint = html.unescape(found.group(1)).format(session=session)
    replayed = run(hint, Path.cwd())  # the shell that started the gateway
    assert (replayed.returncode, f"session {session}" in replayed.stdout) == (0, True), \
        (hint, replayed.stderr)
