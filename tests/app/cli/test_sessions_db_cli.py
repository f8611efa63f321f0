"""``gateway sessions export-jsonl|import`` and the read-side commands on a PostgreSQL store."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.cli import main
from sessions.persist import persist_call, record_outcome
from sessions.postgres.store import PostgresSessionStore
from sessions.records import Outcome
from sessions.replay import replay_bytes
from sessions.replay_json import replay_json
from tests.sessions.helpers import (
    PROMPT_A,
    PROMPT_B,
    SEED_DIR,
    add,
    assistant,
    call_request,
    user,
)
from tests.sessions.pg import PG_URL, create_schema, drop_schema

pytestmark = pytest.mark.services

SEEDS = ["v1-messages-only.jsonl", "v2-prompt-timeline.jsonl", "v2-no-prompts.jsonl",
         "v2-late-prompt-torn-tail.jsonl"]


@dataclass(frozen=True)
class Result:
    code: int | str | None
    out: bytes
    err: str

    @property
    def text(self) -> str:
        return self.out.decode()


@pytest.fixture
def schema() -> Iterator[str]:
    name = asyncio.run(create_schema())
    yield name
    asyncio.run(drop_schema(name))


@pytest.fixture
def cli(capsysbinary: pytest.CaptureFixture[bytes], schema: str,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., Result]:
    """``gateway <args>`` in-process, the store given by GATEWAY_STORE_URL and ``--schema``."""
    monkeypatch.setenv("GATEWAY_STORE_URL", PG_URL)
    monkeypatch.setenv("GATEWAY_DATA_DIR", str(tmp_path / "no-jsonl-here"))

    def run(*argv: str, db: bool = True) -> Result:
        args = [*argv, "--schema", schema] if db else list(argv)
        try:
            code: int | str | None = main(args)
        except SystemExit as exc:  # argparse usage errors exit this way, as from the shell
            code = exc.code
        out, err = capsysbinary.readouterr()
        return Result(code, out, err.decode())

    return run


async def _in_db(schema: str, action: Callable[[PostgresSessionStore], Any]) -> Any:
    store = await PostgresSessionStore.connect(PG_URL, schema=schema)
    try:
        return await action(store)
    finally:
        await store.aclose()


def in_db(schema: str, action: Callable[[PostgresSessionStore], Any]) -> Any:
    return asyncio.run(_in_db(schema, action))


async def read_default(store: PostgresSessionStore, session_id: str) -> bytes:
    return await store.read_log("default", session_id)


async def write_session(store: PostgresSessionStore) -> None:
    writer = await store.create(tenant="acme", channel="web", conversation="c", session_id="s1")
    await add(writer, user("hello"))
    await persist_call(writer, call_request(PROMPT_A, ((0, 1),)))
    await add(writer, assistant("hi"))
    await record_outcome(writer, Outcome(call=0, stop_reason="end_turn"))
    await add(writer, user("again"))
    await persist_call(writer, call_request(PROMPT_B, ((0, 3),), reason="rebuilt"))
    await add(writer, assistant("hi again"))
    await writer.aclose()


def test_export_jsonl_replays_like_the_database(cli: Callable[..., Result], schema: str,
                                                tmp_path: Path) -> None:
    """The exported file (0600) holds the database's log; its replay equals the DB replay."""
    in_db(schema, write_session)
    stored: bytes = in_db(schema, lambda s: s.read_log("acme", "s1"))
    target = tmp_path / "s1.jsonl"
    result = cli("sessions", "export-jsonl", "s1", "--tenant", "acme", "--out", str(target))
    assert (result.code, result.out) == (0, b"")
    count = len(stored.splitlines())
    assert result.err == f"wrote {target}: {count} lines, {len(stored)} bytes\n"
    exported = target.read_bytes()
    assert (exported, stat.S_IMODE(target.stat().st_mode)) == (stored, 0o600)
    file_replay = replay_json(replay_bytes(exported))
    assert file_replay == replay_json(replay_bytes(stored))
    assert (file_replay["version"], file_replay["problems"], len(file_replay["calls"])) == (
        3, [], 2)
    again = cli("sessions", "export-jsonl", "s1", "--tenant", "acme", "--out", str(target))
    assert (again.code, again.err) == (2, f"gateway sessions: {target} exists; not overwritten\n")
    to_stdout = cli("sessions", "export-jsonl", "s1", "--tenant", "acme")
    assert (to_stdout.code, to_stdout.out) == (0, stored)


def test_export_of_unknown_session_is_a_usage_error(cli: Callable[..., Result]) -> None:
    """An unknown id is one line, exit 2."""
    result = cli("sessions", "export-jsonl", "nope")
    assert (result.code, result.out) == (2, b"")
    assert result.err == "gateway sessions: no session 'nope' for tenant 'default'\n"


def test_import_seed_logs_replay_like_the_files(cli: Callable[..., Result], schema: str) -> None:
    """v1/v2 seed logs import byte for byte; `gateway replay` of each equals the file's."""
    paths = [str(SEED_DIR / name) for name in SEEDS]
    result = cli("sessions", "import", *paths)
    assert (result.code, result.err) == (0, "")
    lines = result.text.splitlines()
    assert [line.split(" as ")[0] for line in lines if not line.startswith("  ")] == [
        f"imported {p}" for p in paths]
    assert lines[-1].startswith("  skipped a torn last line (")
    for path in paths:
        data = Path(path).read_bytes()
        sid = orjson.loads(data.splitlines()[0])["id"]
        from_file = orjson.loads(cli("replay", path, "--json", db=False).out)
        from_db = orjson.loads(cli("replay", sid, "--json").out)
        assert from_file.pop("tornTail") == path.endswith("torn-tail.jsonl")
        assert from_db.pop("tornTail") is False
        assert from_db == from_file
        stored: bytes = in_db(schema, partial(read_default, session_id=sid))
        assert data.startswith(stored)


def test_import_reports_bad_files_and_goes_on(cli: Callable[..., Result], tmp_path: Path) -> None:
    """Unreadable or duplicate files are reported one line each; the rest import; exit 1."""
    good = SEED_DIR / "v2-no-prompts.jsonl"
    missing = tmp_path / "missing.jsonl"
    result = cli("sessions", "import", str(SEED_DIR / "empty.jsonl"), str(good), str(missing),
                 str(good), "--tenant", "acme")
    assert result.code == 1
    assert result.text == (
        f"imported {good} as acme/20260803-110000-0a0b0c (v2, 3 lines, 357 bytes)\n")
    assert result.err.splitlines() == [
        f"gateway sessions import: {SEED_DIR / 'empty.jsonl'}: session file is empty",
        f"gateway sessions import: {missing}: No such file or directory",
        f"gateway sessions import: {good}: session 20260803-110000-0a0b0c already exists",
    ]


def test_import_needs_a_database(cli: Callable[..., Result],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a database URL the JSONL store is used, and import says it needs PostgreSQL."""
    monkeypatch.delenv("GATEWAY_STORE_URL")
    result = cli("sessions", "import", str(SEED_DIR / "v2-no-prompts.jsonl"), db=False)
    assert (result.code, result.out) == (2, b"")
    assert result.err == ("gateway sessions: import needs a PostgreSQL store: give --store-url "
                          "or set GATEWAY_STORE_URL\n")


@pytest.mark.parametrize(
    "command",
    [["replay"], ["replay", "--turn", "2"], ["drift"], ["export", "--format", "jsonl"]],
)
def test_read_commands_see_a_db_session_as_its_file(
    cli: Callable[..., Result], schema: str, tmp_path: Path, command: list[str]
) -> None:
    """replay, drift and export print the same for the database session and its export."""
    in_db(schema, write_session)
    exported = tmp_path / "s1.jsonl"
    assert cli("sessions", "export-jsonl", "s1", "--tenant", "acme",
               "--out", str(exported)).code == 0
    from_db = cli(command[0], "s1", "--tenant", "acme", *command[1:])
    from_file = cli(command[0], str(exported), *command[1:], db=False)
    assert (from_db.code, from_db.err) == (0, "")
    assert from_db.out == from_file.out
    assert from_db.out


def test_store_url_option_wins_over_the_environment(cli: Callable[..., Result], schema: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """--store-url names the database even when GATEWAY_STORE_URL is unset."""
    in_db(schema, write_session)
    monkeypatch.delenv("GATEWAY_STORE_URL")
    result = cli("replay", "--list", "--tenant", "acme", "--store-url", PG_URL)
    assert (result.code, result.text.splitlines()[1].split()[0]) == (0, "s1")
    broken = cli("replay", "s1", "--tenant", "acme", "--store-url",
                 "postgresql://gw:hunter2secret@127.0.0.1:1/test")
    assert (broken.code, broken.out) == (1, b"")
    assert "hunter2secret" not in broken.err


def test_schema_and_url_from_dotenv(cli: Callable[..., Result], schema: str, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """With GATEWAY_STORE_URL and GATEWAY_STORE_SCHEMA only in .env, the operator commands
    read that database and schema, as `gateway run` would."""
    in_db(schema, write_session)
    monkeypatch.delenv("GATEWAY_STORE_URL")
    monkeypatch.delenv("GATEWAY_STORE_SCHEMA", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text(f"GATEWAY_STORE_URL={PG_URL}\nGATEWAY_STORE_SCHEMA={schema}\n")
    listing = cli("replay", "--list", "--tenant", "acme", db=False)
    assert (listing.code, listing.text.splitlines()[1].split()[0]) == (0, "s1")
    status = cli("db", "status", db=False)
    assert status.code == 0
    assert f"schema {schema}: version" in status.text
