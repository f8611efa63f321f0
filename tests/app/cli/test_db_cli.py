"""``gateway db upgrade|status``: idempotent upgrades, status, URLs and one-line errors."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.cli import main
from app.hints import cli_command
from sessions.postgres import schema as pg_schema
from tests.sessions.pg import PG_URL, connect, create_schema, drop_schema

pytestmark = pytest.mark.services


@dataclass(frozen=True)
class Result:
    code: int | str | None
    out: str
    err: str


@pytest.fixture
def schema() -> Iterator[str]:
    """The name of a schema that does not exist yet (dropped after the test)."""
    name = asyncio.run(create_schema(migrate=False))
    yield name
    asyncio.run(drop_schema(name))


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """``gateway db <args>`` in-process through ``app.cli.main``."""
    def run(*argv: str) -> Result:
        try:
            code: int | str | None = main(["db", *argv])
        except SystemExit as exc:  # argparse usage errors exit this way, as from the shell
            code = exc.code
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return run


async def version_of(schema: str) -> int:
    conn = await connect()
    try:
        return await pg_schema.current_version(conn, schema)
    finally:
        await conn.close()


def test_upgrade_is_idempotent(cli: Callable[..., Result], schema: str) -> None:
    """The first upgrade migrates from 0; running it again changes nothing and says so."""
    where = f"{PG_URL} schema {schema}"
    first = cli("upgrade", "--url", PG_URL, "--schema", schema)
    second = cli("upgrade", "--url", PG_URL, "--schema", schema)
    assert [(r.code, r.out, r.err) for r in (first, second)] == [
        (0, f"{where}: version {pg_schema.LATEST} (upgraded from 0)\n", ""),
        (0, f"{where}: version {pg_schema.LATEST} (already up to date)\n", ""),
    ]
    status = cli("status", "--url", PG_URL, "--schema", schema)
    lines = status.out.splitlines()
    latest = pg_schema.LATEST
    assert (status.code, lines[0]) == (0, f"{where}: version {latest} of {latest} (up to date)")
    for line, migration in zip(lines[1:], pg_schema.MIGRATIONS, strict=True):
        assert line.split()[0] == str(migration.version)
        assert line.endswith(migration.description)
    assert asyncio.run(version_of(schema)) == pg_schema.LATEST


def test_status_changes_nothing(cli: Callable[..., Result], schema: str,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    """status on an empty schema says an upgrade is needed (the command spelled as this one
    is run: tests/app/test_hints.py) and creates nothing (URL from env)."""
    monkeypatch.setenv("GATEWAY_STORE_URL", PG_URL)
    result = cli("status", "--schema", schema)
    assert (result.code, result.out, result.err) == (
        0, f"{PG_URL} schema {schema}: version 0 of {pg_schema.LATEST} "
        f"(needs `{cli_command()} db upgrade`)\n", "")
    assert asyncio.run(version_of(schema)) == 0


def test_without_url_is_a_usage_error(cli: Callable[..., Result],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """No --url and no GATEWAY_STORE_URL: one line, exit 2."""
    monkeypatch.delenv("GATEWAY_STORE_URL", raising=False)
    result = cli("upgrade")
    assert (result.code, result.out, result.err) == (
        2, "", "gateway db: no database: give --url or set GATEWAY_STORE_URL\n")


def test_unreachable_database_hides_the_password(cli: Callable[..., Result]) -> None:
    """A refused connection is one line, exit 1, with the password masked."""
    result = cli("upgrade", "--url", "postgresql://gw:hunter2secret@127.0.0.1:1/test")
    assert (result.code, result.out, result.err.count("\n")) == (1, "", 1)
    assert result.err.startswith("gateway db: cannot connect to postgresql://gw:***@127.0.0.1:1/")
    assert "hunter2secret" not in result.err


def test_bad_schema_name_is_a_usage_error(cli: Callable[..., Result]) -> None:
    """A schema that is not a plain identifier is refused by the parser, before connecting."""
    result = cli("upgrade", "--url", PG_URL, "--schema", 'x"; DROP TABLE y')
    assert (result.code, result.out) == (2, "")
    assert "not a plain identifier" in result.err


def test_run_on_a_schema_never_upgraded_is_one_line_exit_2(schema: str, tmp_path: Path) -> None:
    """`gateway run` with a PostgreSQL store whose schema was never upgraded stops at start
    with one line naming the command that fixes it, exit 2, instead of starting healthy and
    answering every message 500."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update(GATEWAY_STORE_URL=PG_URL, GATEWAY_STORE_SCHEMA=schema, GATEWAY_CHANNELS="web",
               GATEWAY_PROVIDER="offline")
    try:
        done = subprocess.run([sys.executable, "-m", "gateway", "run", "--port", "0",
                               "--data-dir", str(tmp_path / "data")], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"gateway run kept running on a schema never upgraded: {exc.stderr!r}")
    last = done.stderr.splitlines()[-1] if done.stderr else ""
    assert (done.returncode, done.stdout, "Traceback" in done.stderr) == (2, "", False), \
        done.stderr
    prefix = (f"gateway run: session database schema {schema!r} has no session tables; "
              f"this gateway needs version {pg_schema.LATEST}: run `")
    assert (last.startswith(prefix), last.endswith(" db upgrade`")) == (True, True), last
    fix = subprocess.run(last.removeprefix(prefix)[:-1], shell=True, cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert (fix.returncode, asyncio.run(version_of(schema))) == (0, pg_schema.LATEST), fix.stderr
