"""``gateway drift``: table, JSON and CSV output, --all across tenants, metrics, one-line errors."""

from __future__ import annotations

import asyncio
import csv
import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from app.cli import main
from sessions.drift import COLUMNS, as_dicts, drift
from sessions.replay import replay_bytes
from tests.sessions.helpers import SEED_DIR
from tests.sessions.test_cache_bust import NEW_SOUL, A, B, Log
from tests.sessions.test_drift import VERSIONS, build_drift_session
from tests.waiting import next_millisecond


@dataclass(frozen=True)
class Result:
    code: int | str | None
    out: str
    err: str


@dataclass(frozen=True)
class Data:
    root: Path
    drift_path: Path


async def _build(root: Path) -> Path:
    path = await build_drift_session(root, "drift")
    await next_millisecond()  # distinct startedAt (millisecond precision): stable --all order
    await build_drift_session(root, "other", tenant="acme")
    return path


@pytest.fixture
def data(tmp_path: Path) -> Data:
    root = tmp_path / "data"
    return Data(root, asyncio.run(_build(root)))


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], data: Data) -> Callable[..., Result]:
    """``gateway drift --data-dir <data> <args>`` in-process through ``app.cli.main``."""
    def run(*argv: str) -> Result:
        try:
            code: int | str | None = main(["drift", "--data-dir", str(data.root), *argv])
        except SystemExit as exc:  # argparse usage errors exit this way, as from the shell
            code = exc.code
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return run


def assert_one_line_error(result: Result, code: int) -> None:
    assert (result.code, result.out) == (code, "")
    assert result.err.count("\n") == 1
    assert result.err.startswith("gateway drift: ")


def test_json_equals_the_library_rows(cli: Callable[..., Result], data: Data) -> None:
    """--format json prints exactly as_dicts(drift(replay)) for the session."""
    result = cli("drift", "--format", "json")
    assert (result.code, result.err) == (0, "")
    expected = as_dicts(drift(replay_bytes(data.drift_path.read_bytes())))
    assert orjson.loads(result.out) == orjson.loads(orjson.dumps(expected))
    assert len(expected) == 14


def test_table_is_readable(cli: Callable[..., Result]) -> None:
    """The default table: a session line, a header, one aligned row per point."""
    result = cli("drift", "--section", "mood")
    assert (result.code, result.err) == (0, "")
    lines = result.out.splitlines()
    assert lines[0] == "session drift  metric ratio"
    assert lines[1].split() == list(COLUMNS)
    rows = [line.split() for line in lines[2:]]
    assert [(r[0], r[4], r[5]) for r in rows] == [
        ("1", "mood", "yes"), ("2", "mood", "yes"), ("3", "mood", "no"), ("4", "mood", "yes"),
    ]
    assert rows[1][-7:] == ["13", "+5", "-4", "0.667", "0.667", "0.333", "no"]


def test_csv_with_repeated_section_option(cli: Callable[..., Result]) -> None:
    """--format csv with two --section options: header plus only those sections' rows."""
    result = cli("drift", "--format", "csv", "--section", "soul", "--section", "kb")
    assert result.code == 0
    parsed = list(csv.reader(io.StringIO(result.out)))
    assert parsed[0] == list(COLUMNS)
    assert [(r[0], r[4]) for r in parsed[1:]] == [
        ("1", "soul"), ("2", "soul"), ("3", "soul"), ("3", "kb"), ("4", "soul"), ("4", "kb"),
    ]
    assert [r[2] for r in parsed[1:] if r[4] == "soul"] == [v.fingerprint for v in VERSIONS]


def test_jaccard_and_dotted_path_metrics(cli: Callable[..., Result]) -> None:
    """--metric jaccard and --metric module:function change the similarities."""
    jac = orjson.loads(cli("drift", "--format", "json", "--metric", "jaccard",
                           "--section", "memory").out)
    assert [r["similarity_prev"] for r in jac] == [None, 6 / 9, 1.0, 1.0]
    custom = cli("drift", "--format", "json", "--section", "mood",
                 "--metric", "tests.sessions.test_drift:length_metric")
    assert custom.code == 0
    assert orjson.loads(custom.out)[1]["similarity_prev"] == len("## Mood\ncalm") / len(
        "## Mood\ntired")


def test_all_prefixes_tenant_and_session(cli: Callable[..., Result]) -> None:
    """--all covers every tenant, oldest first, each row led by its tenant and session id."""
    rows = orjson.loads(cli("--all", "--format", "json", "--section", "kb").out)
    assert [(r["tenant"], r["session"], r["version"]) for r in rows] == [
        ("default", "drift", 3), ("default", "drift", 4),
        ("acme", "other", 3), ("acme", "other", 4),
    ]
    assert list(rows[0])[:3] == ["tenant", "session", "version"]
    table = cli("--all", "--section", "kb").out.splitlines()
    assert table[0].split()[:3] == ["tenant", "session", "version"]
    assert [line.split()[:3] for line in table[1:]] == [
        ["default", "drift", "3"], ["default", "drift", "4"], ["acme", "other", "3"],
        ["acme", "other", "4"],
    ]
    parsed = list(csv.reader(io.StringIO(cli("--all", "--format", "csv").out)))
    assert parsed[0] == ["tenant", "session", *COLUMNS]
    assert len(parsed) == 1 + 28


def test_all_with_tenant(cli: Callable[..., Result]) -> None:
    """--all --tenant acme covers only that tenant's sessions."""
    rows = orjson.loads(cli("--all", "--tenant", "acme", "--format", "json").out)
    assert {(r["tenant"], r["session"]) for r in rows} == {("acme", "other")}


def test_all_skips_an_unreadable_log_and_exits_1(cli: Callable[..., Result], data: Data) -> None:
    """An empty log is reported on stderr; the others are still printed; exit 1."""
    (data.root / "sessions" / "broken.jsonl").write_bytes(b"")
    result = cli("--all", "--format", "json", "--section", "kb")
    assert result.code == 1
    assert result.err == "gateway drift: skipped default/broken: session file is empty\n"
    assert len(orjson.loads(result.out)) == 4


def test_seed_v2_file_by_path(cli: Callable[..., Result]) -> None:
    """A seed v2 file given by path: one section named "prompt", three versions."""
    result = cli(str(SEED_DIR / "v2-prompt-timeline.jsonl"), "--format", "csv")
    assert result.code == 0
    parsed = list(csv.reader(io.StringIO(result.out)))
    assert [(r[0], r[4], r[5]) for r in parsed[1:]] == [
        ("1", "prompt", "true"), ("2", "prompt", "true"), ("3", "prompt", "true"),
    ]


def test_v1_file_says_there_is_nothing_to_compare(cli: Callable[..., Result]) -> None:
    """A v1 log prints its notice and no rows (JSON: an empty list)."""
    path = str(SEED_DIR / "v1-messages-only.jsonl")
    assert cli(path).out.splitlines()[1:] == [
        "notice: system prompt not recorded (predates prompt recording)",
        "(no prompt versions: nothing to compare)",
    ]
    assert cli(path, "--format", "json") == Result(0, "[]\n", "")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((), "give a session id or --all (not both)"),
        (("drift", "--all"), "give a session id or --all (not both)"),
        (("drift", "--metric", "nope"), "unknown metric 'nope'"),
        (("drift", "--section", "nope"), "has no section named nope (it has: kb, memory, mood"),
        (("missing",), "no session 'missing' for tenant 'default'"),
        (("./no-such-folder/x.jsonl",), "no such file: ./no-such-folder/x.jsonl"),
    ],
)
def test_usage_errors_are_one_line_exit_2(
    cli: Callable[..., Result], argv: tuple[str, ...], message: str
) -> None:
    """Bad arguments end with one line on stderr and exit 2, never a traceback."""
    result = cli(*argv)
    assert_one_line_error(result, 2)
    assert message in result.err


def test_bad_format_is_an_argparse_error(cli: Callable[..., Result]) -> None:
    """An unknown --format is refused by the parser with exit 2."""
    result = cli("drift", "--format", "xml")
    assert result.code == 2
    assert "invalid choice" in result.err


def test_gateway_drift_names_the_change(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The drift table ends with one line per cache-busting change."""
    log = Log()
    log.call(A)
    log.call(NEW_SOUL)
    log.call(B)
    path = tmp_path / "s.jsonl"
    path.write_bytes(log.bytes())
    assert main(["drift", str(path), "--data-dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2:] == [
        "call 2 (prompt v2): cache-busting change in section soul (the stable prefix every "
        "conversation shares)",
        "call 3 (prompt v3): cache-busting change in section soul (the stable prefix every "
        "conversation shares)"]
