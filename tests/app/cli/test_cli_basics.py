"""What every command shares: settings read as `gateway run` reads them (.env included),
--version, help written for users, shell completion, and start-up failures as one line with
exit 2 (busy port, unreachable platform, rejected token)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from app.cli import SUBCOMMANDS, main, version
from sessions.jsonl import JsonlSessionStore
from tests.fakes.slack_api import FakeSlackServer
from tests.ports import refusing_port
from tests.sessions.helpers import add, user

Run = Callable[..., tuple[int, str, str]]
SETTINGS_VARIABLES = ("GATEWAY_DATA_DIR", "GATEWAY_STORE_URL", "GATEWAY_STORE_SCHEMA",
                      "GATEWAY_REDIS_URL", "GATEWAY_CHANNELS", "GATEWAY_PROVIDER",
                      "TELEGRAM_BOT_TOKEN", "SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET")


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh working directory (where `.env` is read from) and no gateway variables."""
    monkeypatch.chdir(tmp_path)
    for name in SETTINGS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return tmp_path


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    def go(*argv: str) -> tuple[int, str, str]:
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse's --help/--version exit this way
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return go


def test_version(run: Run) -> None:
    """--version prints the installed version and exits 0."""
    assert run("--version") == (0, f"gateway {version()}\n", "")
    assert version() != "unknown"


def test_help_speaks_to_users(run: Run) -> None:
    """gateway --help describes the program and common tasks, not the module; every
    command's --help has a description, and none shows docstring markup."""
    code, out, _ = run("--help")
    assert code == 0
    assert "common tasks:" in out
    assert "gateway replay ID --call 2" in out
    for bad in ("``", ":mod:", "dispatches"):
        assert bad not in out
    # Every command the top-level help lists (read from it, as a user sees them).
    listed = out.split("COMMAND\n", 1)[1].split("\n\n", 1)[0]
    names = [line.split()[0] for line in listed.splitlines() if line.startswith("    ")
             and not line.startswith("     ")]
    assert {name for name, _ in SUBCOMMANDS} <= set(names)
    for name in names:
        code, text, _ = run(name, "--help")
        assert code == 0, name
        # usage, then the command's description, before its arguments
        described = text.split("\n\n", 1)[1].split("\n\n", 1)[0]
        assert described.strip(), name
        assert not described.startswith(("options:", "positional")), name
        assert "``" not in text, name


def test_completion_code_and_a_completing_shell(here: Path, run: Run) -> None:
    """`gateway completion bash` prints argcomplete's hook for `gateway`, and a shell asking
    for completions of `gateway rep` is answered `replay` by the same parser."""
    code, out, _ = run("completion", "bash")
    assert code == 0
    assert "complete" in out
    assert "gateway" in out
    answer = here / "completions"
    env = {**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": "gateway rep", "COMP_POINT": "11",
           "COMP_TYPE": "9", "_ARGCOMPLETE_STDOUT_FILENAME": str(answer), "_ARGCOMPLETE_IFS": " "}
    subprocess.run([sys.executable, "-m", "gateway"], env=env, check=True, timeout=60,
                   stdin=subprocess.DEVNULL, capture_output=True)
    assert answer.read_text().split() == ["replay"]


async def _session(data_dir: Path) -> str:
    store = JsonlSessionStore(data_dir, durability="none")
    writer = await store.create(tenant="default", channel="web", conversation="c1")
    await add(writer, user("hello from .env"))
    await writer.aclose()
    await store.aclose()
    return writer.session_id


def test_operator_commands_read_dotenv(here: Path, run: Run) -> None:
    """With GATEWAY_DATA_DIR only in .env, `replay --list` finds the sessions there (as
    `gateway run` would), and --data-dir still wins over it."""
    import asyncio

    data = here / "elsewhere"
    session = asyncio.run(_session(data))
    (here / ".env").write_text(f"GATEWAY_DATA_DIR={data}\n")
    code, out, _ = run("replay", "--list")
    assert code == 0
    assert session in out
    assert "'hello from .env'" in out
    code, out, _ = run("replay", "--list", "--data-dir", str(here / "empty"))
    assert (code, out) == (0, "(no sessions)\n")


def test_list_json_says_which_session_of_a_conversation_came_last(here: Path, run: Run) -> None:
    """`replay --list --json` carries each session's ``generation`` (1, 2, ... per conversation;
    the highest is the one the conversation goes on in), 0 for a header written before it."""
    import asyncio

    import orjson

    async def three() -> list[str]:
        store = JsonlSessionStore(here / "data", durability="none")
        ids = []
        for text in ("first", "second"):
            writer = await store.create(tenant="default", channel="web", conversation="c1")
            await add(writer, user(text))
            await writer.aclose()
            ids.append(writer.session_id)
        other = await store.create(tenant="default", channel="web", conversation="c2")
        await other.aclose()
        await store.aclose()
        return [*ids, other.session_id]

    first, second, other = asyncio.run(three())
    code, out, _ = run("replay", "--list", "--json", "--data-dir", str(here / "data"))
    assert code == 0
    listed = {s["id"]: s["generation"] for s in orjson.loads(out)}
    assert listed == {first: 1, second: 2, other: 1}


def test_a_bad_setting_in_dotenv_is_one_line(here: Path, run: Run) -> None:
    """An invalid value in .env stops an operator command with one line naming it, exit 2."""
    (here / ".env").write_text("GATEWAY_LOG_LEVEL=LOUD\n")
    code, out, err = run("replay", "--list")
    assert (code, out, err.count("\n")) == (2, "", 1)
    assert "GATEWAY_LOG_LEVEL" in err


def _busy_port() -> tuple[socket.socket, int]:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder, holder.getsockname()[1]


def test_busy_port_is_one_line_exit_2(here: Path, run: Run) -> None:
    """`gateway run` on a port in use: one line naming the address, exit 2, no traceback."""
    holder, port = _busy_port()
    with holder:
        code, out, err = run("run", "--host", "127.0.0.1", "--port", str(port),
                             "--data-dir", str(here / "d"))
    assert (code, out) == (2, "")
    assert err.startswith(f"gateway run: cannot listen on 127.0.0.1:{port}: ")
    assert "Traceback" not in err
    assert err.count("\n") == 1


def test_unreachable_telegram_is_one_line_exit_2(here: Path, run: Run,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """getMe against a platform that does not answer: one line, exit 2, no token shown."""
    token = "123456:very-secret-token"
    with refusing_port() as port:  # held: a port let go could be answered by whoever took it
        monkeypatch.setenv("GATEWAY_CHANNELS", "telegram")
        monkeypatch.setenv("TELEGRAM_BOT_TOKEN", token)
        monkeypatch.setenv("TELEGRAM_API_BASE_URL", f"http://127.0.0.1:{port}/bot")
        code, out, err = run("run", "--port", "0", "--data-dir", str(here / "d"))
    assert (code, out) == (2, "")
    assert err.startswith("gateway run: telegram: getMe failed")
    assert err.count("\n") == 1
    assert token not in err


async def test_rejected_slack_token_is_one_line_exit_2(here: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A bot token Slack rejects (invalid_auth) stops `gateway run` with one line, exit 2."""
    import asyncio

    async with FakeSlackServer() as fake:
        monkeypatch.setenv("GATEWAY_CHANNELS", "slack")
        monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-wrong-token")
        monkeypatch.setenv("SLACK_SIGNING_SECRET", fake.signing_secret)
        monkeypatch.setenv("SLACK_API_BASE_URL", fake.api_base_url)
        argv = ["run", "--port", "0", "--data-dir", str(here / "d")]
        code = await asyncio.to_thread(main, argv)
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err.startswith("gateway run: slack: auth.test failed (auth.test: invalid_auth)")
    assert "invalid_auth" in err
    assert err.count("\n") == 1


async def test_rejected_slack_app_token_is_one_line_exit_2(
        here: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A Socket Mode app token Slack refuses stops `gateway run` with one line naming
    SLACK_APP_TOKEN, exit 2 (it used to run deaf, a traceback every 10 s); a bot token put
    there by mistake is refused the same way, and neither token is shown."""
    import asyncio

    async with FakeSlackServer() as fake:
        monkeypatch.setenv("GATEWAY_CHANNELS", "slack")
        monkeypatch.setenv("SLACK_BOT_TOKEN", fake.bot_token)
        monkeypatch.setenv("SLACK_API_BASE_URL", fake.api_base_url)
        argv = ["run", "--port", "0", "--data-dir", str(here / "d")]
        results = []
        for wrong, error in (("xapp-1-wrong-app-token", "invalid_auth"),
                             (fake.bot_token, "not_allowed_token_type")):
            monkeypatch.setenv("SLACK_APP_TOKEN", wrong)
            code = await asyncio.to_thread(main, argv)
            out, err = capsys.readouterr()
            # The log's INFO lines before it (the bot token was fine), then the one line.
            last = err.splitlines()[-1]
            results.append((code, out, "Traceback" in err, wrong in err))
            assert last.startswith("gateway run: slack: SLACK_APP_TOKEN was refused "
                                   f"(apps.connections.open: {error})"), err
    assert results == [(2, "", False, False), (2, "", False, False)]
