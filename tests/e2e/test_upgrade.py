"""A data folder made by the gateway before scopes (``fixtures/pre-scopes``: written by that
version's ``build_gateway`` over the web chat, offline provider) runs under this one, kept in
the shared tenant (``GATEWAY_WEB_TENANT=default``, as the upgrade notes say): an old web
conversation is not taken over by whoever names its id (its owner cannot be told: the old
version keyed it on the id alone), so the same id starts a fresh conversation of the browser's
own while the old session stays as it was; the shared memory becomes operator text (logged
once), new memories stay with their person, and ``gateway forget`` finds the old sessions."""

from __future__ import annotations

import asyncio
import io
import logging
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from app.cli import main as cli_main
from app.compose import build_gateway
from app.config import Settings
from channels.web.identity import COOKIE
from sessions.replay import replay_bytes

FIXTURE = Path(__file__).parent / "fixtures" / "pre-scopes"
ADA_SESSION = "20261201-144118-54772224bf0c"
BROWSERS: dict[str, str] = {}


async def chat(port: int, conversation: str, text: str) -> dict[str, Any]:
    """A web message from the browser named ``conversation`` (each its own person: the
    identity cookie its chat page got, kept across the gateway's restarts)."""
    cookie = BROWSERS.get(conversation)
    if cookie is None:
        async with aiohttp.ClientSession() as http, http.get(
                f"http://127.0.0.1:{port}/") as page:
            cookie = BROWSERS[conversation] = page.cookies[COOKIE].value
    async with aiohttp.ClientSession() as http, http.post(
        f"http://127.0.0.1:{port}/api/chat", json={"conversation": conversation, "text": text},
        headers={"Cookie": f"{COOKIE}={cookie}"},
    ) as response:
        assert response.status == 200, await response.text()
        body: dict[str, Any] = await response.json()
        return body


async def test_previous_data_folder_runs_and_migrates(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Old sessions stay (not resumed by a client naming their id), the old shared MEMORY.md
    is kept as operator text, the migration is logged once, new memories are per person, and
    the old sessions can be erased."""
    data = tmp_path / "data"
    shutil.copytree(FIXTURE, data)
    before = (data / "persona" / "MEMORY.md").read_bytes()
    caplog.set_level(logging.WARNING, logger="gateway.persona.workspace")
    old_ada = (data / "sessions" / f"{ADA_SESSION}.jsonl").read_bytes()
    settings = Settings(_env_file=None, GATEWAY_DATA_DIR=str(data),  # type: ignore[call-arg]
                        GATEWAY_PORT=0, GATEWAY_WEB_TENANT="default")
    for _ in range(2):  # two starts: the second one says nothing more
        gateway = build_gateway(settings)
        await gateway.start()
        try:
            resumed = await chat(gateway.bound_port, "ada", "hello again")
            await chat(gateway.bound_port, "bob", "remember that I like jazz")
        finally:
            await gateway.aclose()
    assert resumed["session"] != ADA_SESSION
    assert (data / "sessions" / f"{ADA_SESSION}.jsonl").read_bytes() == old_ada
    assert (data / "persona" / "MEMORY.md").read_bytes() == before == b"I like tea\n"
    warnings = [r for r in caplog.records if r.name == "gateway.persona.workspace"]
    assert len(warnings) == 1
    assert "MEMORY.md (10 characters)" in warnings[0].getMessage()

    ada = replay_bytes((data / "sessions" / f"{resumed['session']}.jsonl").read_bytes())
    last = ada.call(len(ada.calls))
    assert last.prompt is not None
    assert "## Notes from the operator\nI like tea" in last.prompt.text
    assert "jazz" not in last.prompt.text  # bob's new memory is bob's
    [bob] = [p for p in (data / "persona/memory/default/web/people").iterdir()
             if (p / "MEMORY.md").exists()]
    assert (bob / "MEMORY.md").read_text() == (
        "I like jazz\n\nI like jazz\n")  # (said once per start, by one browser)

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = await asyncio.to_thread(cli_main, ["forget", "--user", "web:ada", "--data-dir",
                                                  str(data)])
    assert (code, err.getvalue()) == (0, "")
    assert f"  session  {ADA_SESSION}" in out.getvalue().splitlines()
    assert not (data / "sessions" / f"{ADA_SESSION}.jsonl").exists()
