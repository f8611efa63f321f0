"""``gateway export``: one session or all, stdout or a file, --since, and resuming after a stop."""

from __future__ import annotations

import asyncio
import io
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.cli import build_parser, main
from app.commands import export as export_cmd
from app.version import version
from sessions.export import records
from sessions.jsonl import JsonlSessionStore
from sessions.otlp import SPAN_KIND_CLIENT
from sessions.replay import replay_bytes
from tests.sessions.helpers import SEED_DIR
from tests.sessions.test_export import build_export_session
from tests.waiting import next_millisecond

SESSIONS = [("default", "s1"), ("default", "s2"), ("acme", "t1"), ("default", "s3")]


@dataclass(frozen=True)
class Result:
    code: int | str | None
    out: str
    err: str


class Interrupted(Exception):
    """Raised by the test hook to stop an export half-way."""


async def _build(root: Path) -> None:
    for tenant, sid in SESSIONS:  # oldest first, as --all exports them
        await build_export_session(root, sid, tenant)
        await next_millisecond()  # distinct startedAt (millisecond precision)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    asyncio.run(_build(data))
    return data


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], root: Path) -> Callable[..., Result]:
    """``gateway export --data-dir <root> <args>`` in-process through ``app.cli.main``."""
    def run(*argv: str) -> Result:
        try:
            code: int | str | None = main(["export", "--data-dir", str(root), *argv])
        except SystemExit as exc:  # argparse usage errors exit this way, as from the shell
            code = exc.code
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return run


def lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def call_attributes(traces_data: dict[str, Any]) -> list[dict[str, Any]]:
    """The attributes of the call (CLIENT) spans of an OTLP/JSON line, as plain values."""
    found = []
    for span in traces_data["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        if span["kind"] != SPAN_KIND_CLIENT:
            continue
        values = {}
        for item in span["attributes"]:
            (kind, value), = item["value"].items()
            values[item["key"]] = int(value) if kind == "intValue" else value
        found.append(values)
    return found


def keys(rows: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
    return [(r["tenant"], r["session"], r["call"]) for r in rows]


def expected_keys(sessions: list[tuple[str, str]] = SESSIONS) -> list[tuple[str, str, int]]:
    return [(tenant, sid, turn) for tenant, sid in sessions for turn in (1, 2, 3)]


def session_path(root: Path, tenant: str, sid: str) -> Path:
    base = root if tenant == "default" else root / "tenants" / tenant
    return base / "sessions" / f"{sid}.jsonl"


def test_one_session_to_stdout_as_otlp_json(cli: Callable[..., Result], root: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """ID --format otlp-json prints a trace per turn, equal to the library's records: without
    content, as live traces have none unless their opt-in is on; with it, full content."""
    monkeypatch.delenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", raising=False)
    replay = replay_bytes(session_path(root, "default", "s1").read_bytes())
    result = cli("s1", "--format", "otlp-json")
    assert (result.code, result.err) == (0, "")
    assert [orjson.loads(line) for line in result.out.splitlines()] == list(
        records(replay, "otlp-json", content="none", service_version=version()))
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    full = cli("s1", "--format", "otlp-json")
    assert [orjson.loads(line) for line in full.out.splitlines()] == list(
        records(replay, "otlp-json", content="full", service_version=version()))
    metadata = cli("s1", "--format", "otlp-json", "--content", "metadata")
    assert [orjson.loads(line) for line in metadata.out.splitlines()] == list(
        records(replay, "otlp-json", content="metadata", service_version=version()))
    assert "what time is it?" in full.out
    assert "what time is it?" not in metadata.out + result.out


def test_one_session_to_a_file_as_jsonl(cli: Callable[..., Result], root: Path,
                                        tmp_path: Path) -> None:
    """--out FILE writes the records there and says so in one line on stdout (how many,
    where); a tenant's session by id."""
    out = tmp_path / "t1.jsonl"
    result = cli("t1", "--tenant", "acme", "--format", "jsonl", "--out", str(out))
    written = lines(out)
    assert result == Result(0, f"wrote {len(written)} records of 1 session to {out}\n", "")
    assert keys(written) == expected_keys([("acme", "t1")])
    assert not out.with_name("t1.jsonl.progress").exists()


def test_tenant_export_refuses_another_tenants_file(cli: Callable[..., Result],
                                                     root: Path) -> None:
    """With --tenant, a path to another tenant's log is refused, not relabelled; the tenant's
    own file by path exports as usual."""
    other = session_path(root, "default", "s1")
    result = cli(str(other), "--tenant", "acme", "--format", "jsonl")
    assert result == Result(2, "", f"gateway export: {other} belongs to tenant 'default', "
                                   "not 'acme'\n")
    own = cli(str(session_path(root, "acme", "t1")), "--tenant", "acme", "--format", "jsonl")
    assert own.code == 0
    assert {orjson.loads(x)["tenant"] for x in own.out.splitlines()} == {"acme"}


def test_unknown_tenant_is_a_usage_error(cli: Callable[..., Result], tmp_path: Path) -> None:
    """--all --tenant with a tenant that has no sessions (a typo) is one line naming the
    tenants there are, exit 2, and no file is written."""
    out = tmp_path / "none.jsonl"
    result = cli("--all", "--tenant", "acmee", "--format", "jsonl", "--out", str(out))
    assert result == Result(2, "", "gateway export: no sessions of tenant 'acmee' (tenants with "
                                   "sessions: acme, default)\n")
    assert not out.exists()


def test_seed_file_by_path(cli: Callable[..., Result]) -> None:
    """A seed v2 file given by path exports its three calls."""
    result = cli(str(SEED_DIR / "v2-prompt-timeline.jsonl"), "--format", "jsonl")
    assert result.code == 0
    assert [orjson.loads(x)["call"] for x in result.out.splitlines()] == [1, 2, 3]


def test_all_to_a_file(cli: Callable[..., Result], tmp_path: Path) -> None:
    """--all --out: every tenant's sessions, oldest first; the checkpoint is gone at the end."""
    out = tmp_path / "all.jsonl"
    result = cli("--all", "--format", "otlp-json", "--out", str(out))
    sessions = len({(tenant, session) for tenant, session, _ in expected_keys()})
    assert (result.code, result.out) == (
        0, f"wrote {len(lines(out))} records of {sessions} sessions to {out}\n")
    spans = [span for line in lines(out) for span in call_attributes(line)]
    assert [(s["gateway.tenant"], s["gen_ai.conversation.id"], s["gateway.call"])
            for s in spans] == expected_keys()
    assert not (tmp_path / "all.jsonl.progress").exists()


def test_all_to_stdout_keeps_stdout_clean(cli: Callable[..., Result]) -> None:
    """--all without --out: stdout holds only the records (progress goes to stderr)."""
    result = cli("--all", "--format", "jsonl", "--tenant", "default")
    assert result.code == 0
    assert keys([orjson.loads(x) for x in result.out.splitlines()]) == expected_keys(
        [s for s in SESSIONS if s[0] == "default"])


async def test_interrupted_export_resumes_without_duplicates(root: Path, tmp_path: Path) -> None:
    """Stopped after writing session 2 but before its checkpoint, plus a torn line: the rerun
    drops the uncommitted tail and finishes: every call once, as a clean export."""
    out = tmp_path / "all.jsonl"
    argv = ["export", "--data-dir", str(root), "--all", "--format", "jsonl", "--out", str(out)]
    written: list[str] = []

    def stop_at_second(key: str) -> None:
        written.append(key)
        if len(written) == 2:
            raise Interrupted(key)

    store = JsonlSessionStore(root)
    with pytest.raises(Interrupted):
        await export_cmd.run(build_parser().parse_args(argv), store, io.StringIO(),
                             io.StringIO(), on_session_written=stop_at_second)
    assert written == ["default/s1", "default/s2"]
    progress = out.with_name("all.jsonl.progress")
    checkpoint = [orjson.loads(x) for x in progress.read_bytes().splitlines()]
    assert checkpoint[1:] == [{"session": "default/s1", "offset": checkpoint[1]["offset"]}]
    assert keys(lines(out)) == expected_keys(SESSIONS[:2])  # s2 written, not committed
    with out.open("ab") as fh:
        fh.write(b'{"session":"s3","tur')  # as if the process died mid-write

    code = await asyncio.to_thread(main, argv)
    assert code == 0
    rows = lines(out)
    assert keys(rows) == expected_keys()
    assert Counter(keys(rows)).most_common(1)[0][1] == 1
    assert not progress.exists()
    clean = tmp_path / "clean.jsonl"
    assert await asyncio.to_thread(main, [*argv[:-1], str(clean)]) == 0
    assert out.read_bytes() == clean.read_bytes()


async def test_resume_with_other_options_is_refused(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint from an otlp-json export is not resumed by a jsonl export: exit 2, one line."""
    out = tmp_path / "all.jsonl"
    argv = ["export", "--data-dir", str(root), "--all", "--format", "otlp-json", "--out", str(out)]

    def stop(key: str) -> None:
        raise Interrupted(key)

    with pytest.raises(Interrupted):
        await export_cmd.run(build_parser().parse_args(argv), JsonlSessionStore(root),
                             io.StringIO(), io.StringIO(), on_session_written=stop)
    capsys.readouterr()
    argv[argv.index("otlp-json")] = "jsonl"
    assert await asyncio.to_thread(main, argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("gateway export: ")
    assert "other options" in err


def test_unreadable_session_is_skipped_then_retried(
    cli: Callable[..., Result], root: Path, tmp_path: Path
) -> None:
    """An unreadable log: the rest exported, exit 1, checkpoint kept; once fixed, the rerun
    exports just that session."""
    broken = session_path(root, "default", "s2")
    good = broken.read_bytes()
    broken.write_bytes(b"")
    out = tmp_path / "all.jsonl"
    first = cli("--all", "--format", "jsonl", "--out", str(out))
    assert first.code == 1
    assert "skipped default/s2: session file is empty" in first.err
    assert "progress kept" in first.err
    assert keys(lines(out)) == expected_keys([s for s in SESSIONS if s[1] != "s2"])
    broken.write_bytes(good)
    second = cli("--all", "--format", "jsonl", "--out", str(out))
    assert second.code == 0
    assert "resuming: 3 of 4 sessions already in" in second.err
    assert sorted(keys(lines(out))) == sorted(expected_keys())
    assert not out.with_name("all.jsonl.progress").exists()


def _v2_log(session_id: str, started: str) -> bytes:
    seed = (SEED_DIR / "v2-prompt-timeline.jsonl").read_bytes().splitlines(keepends=True)
    head = orjson.loads(seed[0])
    head.update(id=session_id, startedAt=started)
    return orjson.dumps(head) + b"\n" + b"".join(seed[1:])


@pytest.mark.parametrize(
    ("since", "exported"),
    [("2025-03-01", ["mid", "new"]), ("2025-06-01T12:00:00Z", ["new"]),
     ("2025-06-01T11:00:00", ["mid", "new"]), ("2024-01-01", ["old", "mid", "new"])],
)
def test_since_filters_by_start_time(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, since: str, exported: list[str]
) -> None:
    """--since DATE or ISO time keeps the sessions started at or after it."""
    sessions = tmp_path / "data" / "sessions"
    sessions.mkdir(parents=True)
    for sid, started in [("old", "2025-01-01T00:00:00.000Z"), ("mid", "2025-06-01T11:30:00.000Z"),
                         ("new", "2025-06-01T12:00:00.000Z")]:
        (sessions / f"{sid}.jsonl").write_bytes(_v2_log(sid, started))
    code = main(["export", "--data-dir", str(tmp_path / "data"), "--all", "--since", since,
                 "--format", "jsonl"])
    out = capsys.readouterr().out
    assert code == 0
    assert [orjson.loads(x)["session"] for x in out.splitlines()] == [
        sid for sid in exported for _ in range(3)]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--format", "otlp-json"), "give a session id or --all (not both)"),
        (("s1", "--all", "--format", "otlp-json"), "give a session id or --all (not both)"),
        (("s1", "--since", "2025-01-01", "--format", "otlp-json"), "--since needs --all"),
        (("--all", "--since", "yesterday", "--format", "otlp-json"), "is not YYYY-MM-DD"),
        (("nope", "--format", "otlp-json"), "no session 'nope'"),
        (("--all", "--tenant", "../x", "--format", "otlp-json"), "tenant '../x' is not allowed"),
    ],
)
def test_usage_errors_are_one_line_exit_2(
    cli: Callable[..., Result], argv: tuple[str, ...], message: str
) -> None:
    """Bad arguments end with one line on stderr and exit 2, never a traceback."""
    result = cli(*argv)
    assert (result.code, result.out) == (2, "")
    assert result.err.count("\n") == 1
    assert result.err.startswith("gateway export: ")
    assert message in result.err


def test_format_is_required(cli: Callable[..., Result]) -> None:
    """--format is required (argparse usage error, exit 2)."""
    result = cli("s1")
    assert result.code == 2
    assert "--format" in result.err
