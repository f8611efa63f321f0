"""``gateway replay``: listings, summaries, turns, JSON and request bodies; errors as one line."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.cli import main
from sessions import entries
from sessions.jsonl import JsonlSessionStore
from sessions.persist import persist_call, record_outcome
from sessions.records import Injected, Outcome
from sessions.replay import NOTICE_V1, replay_bytes
from sessions.replay_json import replay_json
from sessions.shapes import SHAPES, encode_body, request_body
from tests.sessions.helpers import (
    PROMPT_A,
    PROMPT_B,
    SEED_DIR,
    TOOLS_A,
    add,
    assistant,
    call_request,
    tool_result,
    tool_use,
    user,
)
from tests.waiting import next_millisecond

ROOT = Path(__file__).resolve().parents[3]
TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
TURN_KEYS = {
    "index", "ts", "status", "why", "notes", "systemPrompt", "promptFingerprint",
    "promptReason", "promptNotice", "messages", "assistant", "provider", "model", "endpoint",
    "params", "tools", "outcome",
}
Q = user("what time is it?")
USE = tool_use("toolu_1", "get_time", {"tz": "UTC"})
RESULT = tool_result("toolu_1", "12:00")
NOON = assistant("It is noon.")
THANKS = user("thanks")
SUMMARY = user("[summary] asked the time")


@dataclass(frozen=True)
class Result:
    code: int | str | None
    out: str
    err: str


@dataclass(frozen=True)
class Sessions:
    data_dir: Path
    live: dict[tuple[int, str], dict[str, Any]]  # (turn, shape) -> body built at call time

    @property
    def gappy(self) -> str:
        """A session outside the data dir, replayed by path (see ``_build``)."""
        return str(self.data_dir.parent / "other" / "sessions" / "gappy.jsonl")

    def path(self, session_id: str, tenant: str = "default") -> Path:
        if tenant == "default":
            return self.data_dir / "sessions" / f"{session_id}.jsonl"
        return self.data_dir / "tenants" / tenant / "sessions" / f"{session_id}.jsonl"


async def _build(data_dir: Path) -> dict[tuple[int, str], dict[str, Any]]:
    store = JsonlSessionStore(data_dir, durability="none")
    live: dict[tuple[int, str], dict[str, Any]] = {}

    async def call(turn: int, request: Any, sent: list[Any]) -> None:
        for shape in SHAPES:
            live[turn, shape] = request_body(shape, request.prompt.text, sent, request.tools,
                                             request.model, request.params)
        await persist_call(writer, request)

    writer = await store.create(channel="telegram", conversation="chat-7", session_id="s1")
    await add(writer, Q)
    await call(1, call_request(PROMPT_A, ((0, 1),)), [Q])
    await add(writer, USE, RESULT)
    await record_outcome(writer, Outcome(call=0, stop_reason="tool_use"))
    await call(2, call_request(PROMPT_A, ((0, 3),)), [Q, USE, RESULT])
    await add(writer, NOON)
    await record_outcome(writer, Outcome(call=1, stop_reason="end_turn"))
    await add(writer, THANKS)
    await call(3, call_request(
        PROMPT_B, ((3, 5),), reason="rebuilt", provider="openai", model="gpt-test",
        injected=(Injected(0, SUMMARY),),
    ), [SUMMARY, NOON, THANKS])
    await record_outcome(writer, Outcome(call=2, error={"kind": "timeout"}))
    await writer.aclose()

    # A session whose first call entry the writer refused (the gap names it) and whose second
    # call names a prompt (and a tool set) the log lacks: recorded, not rebuildable.
    await next_millisecond()
    other = JsonlSessionStore(data_dir.parent / "other", durability="none")
    gappy = await other.create(channel="web", conversation="w2", session_id="gappy")
    await add(gappy, Q)
    await gappy.append([entries.gap("EIO", "2026-01-02T03:04:05.678Z", [{"type": "call"}]),
                        entries.message(NOON)])
    await add(gappy, THANKS)
    await gappy.append([{**entries.call(0, call_request(PROMPT_A, ((0, 3),)), "feedc0de"),
                         "prompt": PROMPT_A.fingerprint}])
    await gappy.aclose()

    await next_millisecond()  # distinct startedAt (millisecond precision) for a stable listing
    torn = await store.create(channel="web", conversation="w1", session_id="torn")
    await add(torn, user("half"))
    await torn.aclose()
    with torn.path.open("ab") as fh:
        fh.write(b'{"type":"message","seq":2,"ts":"20')

    await next_millisecond()
    other = await store.create(tenant="acme", channel="slack", conversation="c9", session_id="t1")
    await add(other, user("acme question"))
    await other.aclose()
    return live


@pytest.fixture
def sessions(tmp_path: Path) -> Sessions:
    data_dir = tmp_path / "data"
    return Sessions(data_dir, asyncio.run(_build(data_dir)))


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], sessions: Sessions) -> Callable[..., Result]:
    """``gateway replay --data-dir <sessions> <args>`` in-process through ``app.cli.main``."""
    def run(*argv: str, data_dir: bool = True) -> Result:
        args = ["replay", *(["--data-dir", str(sessions.data_dir)] if data_dir else []), *argv]
        try:
            code: int | str | None = main(args)
        except SystemExit as exc:  # argparse usage errors exit this way, as from the shell
            code = exc.code
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return run


def normalised(text: str) -> list[str]:
    return TS.sub("TS", text).splitlines()


def assert_one_line_error(result: Result, code: int) -> None:
    assert (result.code, result.out) == (code, "")
    assert result.err.count("\n") == 1
    assert result.err.startswith("gateway replay: ")
    assert "Traceback" not in result.err


# -- listing -------------------------------------------------------------------------------------


def columns(text: str) -> list[list[str]]:
    """A listing as rows of cells (columns are separated by two or more spaces)."""
    return [re.split(r" {2,}", TS.sub("TS", line)) for line in text.splitlines()]


def test_list_has_a_header_and_a_conversation_column(cli: Callable[..., Result]) -> None:
    """--list prints a header, then one row per session, id first, newest first, with its
    conversation; torn ones are flagged and a tenant column appears when tenants differ."""
    result = cli("--list")
    assert (result.code, result.err) == (0, "")
    assert columns(result.out) == [
        ["SESSION", "TENANT", "STARTED", "CHANNEL", "CONVERSATION", "MESSAGES", "FIRST MESSAGE"],
        ["t1", "acme", "TS", "slack", "c9", "1", "'acme question'"],
        ["torn", "default", "TS", "web", "w1", "1", "'half' (torn tail)"],
        ["s1", "default", "TS", "telegram", "chat-7", "5", "'what time is it?'"],
    ]


def test_list_with_tenant_shows_only_that_tenant(cli: Callable[..., Result]) -> None:
    """--list --tenant limits the listing; an unknown tenant lists nothing and says so."""
    assert columns(cli("--list", "--tenant", "acme").out) == [
        ["SESSION", "TENANT", "STARTED", "CHANNEL", "CONVERSATION", "MESSAGES", "FIRST MESSAGE"],
        ["t1", "acme", "TS", "slack", "c9", "1", "'acme question'"],
    ]
    assert [row[0] for row in columns(cli("--tenant", "default", "--list").out)] == [
        "SESSION", "torn", "s1",
    ]
    assert cli("--list", "--tenant", "nobody") == Result(0, "(no sessions)\n", "")


def test_list_json(cli: Callable[..., Result]) -> None:
    """--list --json gives one object per session with the listing's fields."""
    rows = orjson.loads(cli("--list", "--json").out)
    assert [(r["id"], r["tenant"], r["messages"], r["torn"], r["version"]) for r in rows] == [
        ("t1", "acme", 1, False, 3),
        ("torn", "default", 1, True, 3),
        ("s1", "default", 5, False, 3),
    ]


# -- one session ---------------------------------------------------------------------------------


def test_summary(cli: Callable[..., Result]) -> None:
    """The summary shows header, counts, the prompt timeline and one line per turn."""
    result = cli("s1")
    assert (result.code, result.err) == (0, "")
    assert normalised(result.out) == [
        "session s1  (format v3)",
        "  started TS  channel telegram  conversation chat-7  tenant default",
        "  messages 5  calls 3  prompts recorded: yes",
        "prompt timeline:",
        f"  #1  TS  {PROMPT_A.fingerprint}  initial  first call 1  [soul,memory,mood]",
        f"  #2  TS  {PROMPT_B.fingerprint}  rebuilt  first call 3  [soul,memory,mood]",
        "calls:",
        '    1  TS  prompt #1  1 msgs  claude-test  -> <tool_use get_time {"tz":"UTC"}>',
        "    2  TS  prompt #1  3 msgs  claude-test  -> It is noon.",
        "    3  TS  prompt #2  3 msgs  gpt-test  -> [error timeout]",
    ]


def test_summary_of_a_seed_file_by_path(cli: Callable[..., Result]) -> None:
    """A path to a .jsonl file is replayed directly; a v1 log states its prompt was not kept."""
    result = cli(str(SEED_DIR / "v1-messages-only.jsonl"))
    assert result.code == 0
    assert f"notice: {NOTICE_V1}" in result.out.splitlines()


def test_turn_shows_exactly_what_was_sent(cli: Callable[..., Result]) -> None:
    """--call N prints the prompt, tools, every sent message (injected included) and answer."""
    result = cli("s1", "--call", "3")
    assert result.code == 0
    assert result.out.splitlines() == [
        "=== call 3 of session s1: rebuilt",
        'provider openai  model gpt-test  params {"max_tokens":256}',
        f"--- system prompt #2 {PROMPT_B.fingerprint} (rebuilt)",
        *PROMPT_B.text.splitlines(),
        "--- tools: get_time",
        "--- messages sent (3)",
        "[user] [summary] asked the time",
        "[assistant] It is noon.",
        "[user] thanks",
        "--- assistant",
        "[no answer: {'kind': 'timeout'}]",
    ]


def test_turn_json_has_exactly_the_documented_keys(cli: Callable[..., Result]) -> None:
    """--call N --json is one object with exactly the documented keys and verbatim values."""
    turn = orjson.loads(cli("s1", "--call", "2", "--json").out)
    assert set(turn) == TURN_KEYS
    assert {k: v for k, v in turn.items() if k != "ts"} == {
        "index": 2,
        "status": "rebuilt",
        "why": None,
        "notes": [],
        "systemPrompt": PROMPT_A.text,
        "promptFingerprint": PROMPT_A.fingerprint,
        "promptReason": "initial",
        "promptNotice": None,
        "messages": [Q, USE, RESULT],
        "assistant": NOON,
        "provider": "anthropic",
        "model": "claude-test",
        "endpoint": None,  # the call entry records none (an in-process provider, older logs)
        "params": {"max_tokens": 256},
        "tools": list(TOOLS_A),
        "outcome": {"stopReason": "end_turn", "usage": None, "latencyMs": None, "error": None,
                    "responseId": None, "responseModel": None, "costUsd": None},
    }


def test_whole_json_equals_replay_json(cli: Callable[..., Result], sessions: Sessions) -> None:
    """--json prints the documented whole-replay document."""
    doc = orjson.loads(cli("s1", "--json").out)
    assert doc == replay_json(replay_bytes(sessions.path("s1").read_bytes()))
    assert [t["prompt"] for t in doc["calls"]] == [1, 1, 2]


@pytest.mark.parametrize(("turn", "shape"), [(n, s) for n in (1, 2, 3) for s in SHAPES])
def test_request_prints_the_body_sent_at_call_time(
    cli: Callable[..., Result], sessions: Sessions, turn: int, shape: str
) -> None:
    """--request N --shape S prints the same body request_body built when the call was made."""
    result = cli("s1", "--request", str(turn), "--shape", shape)
    assert result.code == 0
    assert orjson.loads(result.out) == sessions.live[turn, shape]


def test_request_of_an_unrecorded_call_exits_1_saying_why(
    cli: Callable[..., Result], sessions: Sessions
) -> None:
    """--request N of a call whose entry the log refused prints no body: one line, exit 1."""
    result = cli(sessions.gappy, "--request", "1")
    assert_one_line_error(result, 1)
    assert result.err == ("gateway replay: session gappy: call 1 cannot be rebuilt: not "
                          "recorded (persist failed: EIO at 2026-01-02T03:04:05.678Z)\n")


def test_request_of_a_call_missing_a_piece_exits_1_naming_it(
    cli: Callable[..., Result], sessions: Sessions
) -> None:
    """--request N of a recorded call whose prompt is not in the log: one line, exit 1."""
    result = cli(sessions.gappy, "--request", "2", "--shape", "openai")
    assert_one_line_error(result, 1)
    assert result.err.endswith("call 2 cannot be rebuilt: recorded but not rebuildable "
                               f"(missing prompt entry {PROMPT_A.fingerprint})\n")


def test_turn_json_and_summary_carry_each_calls_status(
    cli: Callable[..., Result], sessions: Sessions
) -> None:
    """--turn N --json has the call's status and why; the summary marks such calls."""
    first = orjson.loads(cli(sessions.gappy, "--turn", "1", "--json").out)
    second = orjson.loads(cli(sessions.gappy, "--turn", "2", "--json").out)
    assert (first["status"], first["why"], first["messages"], first["assistant"]) == (
        "not_recorded", "persist failed: EIO at 2026-01-02T03:04:05.678Z", None, NOON)
    assert (second["status"], second["why"]) == (
        "not_rebuildable", f"missing prompt entry {PROMPT_A.fingerprint}")
    lines = normalised(cli(sessions.gappy).out)
    assert "gap: line 3: the log refused a call entry (EIO at TS)" in lines
    assert "       not recorded (persist failed: EIO at TS)" in lines
    assert (f"       recorded but not rebuildable (missing prompt entry {PROMPT_A.fingerprint})"
            in lines)


def test_request_defaults_to_the_recorded_provider_shape(
    cli: Callable[..., Result], sessions: Sessions
) -> None:
    """Without --shape, turn 3 (an OpenAI call) is printed in the OpenAI shape."""
    assert orjson.loads(cli("s1", "--request", "3").out) == sessions.live[3, "openai"]
    assert orjson.loads(cli("s1", "--request", "1").out) == sessions.live[1, "anthropic"]


@pytest.mark.parametrize(("turn", "shape"), [(n, s) for n in (1, 3) for s in SHAPES])
def test_raw_request_is_the_exact_bytes(
    cli: Callable[..., Result], sessions: Sessions, turn: int, shape: str
) -> None:
    """--request N --raw prints the encoded body byte for byte, without a newline."""
    result = cli("s1", "--request", str(turn), "--shape", shape, "--raw")
    assert result.code == 0
    assert result.out.encode() == encode_body(sessions.live[turn, shape])


@pytest.mark.parametrize(
    "argv",
    [
        ["s1", "--turn", "2", "--json"],
        ["--json", "--turn", "2", "s1"],
        ["--turn", "2", "s1", "--json"],
        ["--turn=2", "--json", "s1"],
    ],
)
def test_options_in_any_order(cli: Callable[..., Result], argv: list[str]) -> None:
    """Options and the session id may come in any order with the same output."""
    expected = cli("s1", "--turn", "2", "--json")
    assert cli(*argv) == expected


def test_data_dir_from_environment(
    cli: Callable[..., Result], sessions: Sessions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --data-dir, GATEWAY_DATA_DIR names the data directory."""
    monkeypatch.setenv("GATEWAY_DATA_DIR", str(sessions.data_dir))
    assert cli("s1", "--turn", "1", "--json", data_dir=False) == cli("s1", "--turn", "1", "--json")


# -- errors --------------------------------------------------------------------------------------


def test_unknown_session_exits_2(cli: Callable[..., Result]) -> None:
    """An unknown session id is one stderr line and exit 2."""
    result = cli("nosuch")
    assert_one_line_error(result, 2)
    assert "nosuch" in result.err


@pytest.mark.parametrize("bad", ["..", ".hidden", "a" * 200, "a..b", "-x-"])
def test_invalid_session_id_exits_2(cli: Callable[..., Result], bad: str) -> None:
    """An id that is not a safe name is refused as a usage error (exit 2), never a path."""
    assert_one_line_error(cli("--", bad) if bad.startswith("-") else cli(bad), 2)


@pytest.mark.parametrize(
    "argv",
    [
        ["--list", "--tenant", "../x"],
        ["s1", "--tenant", ".."],
        [],
        ["s1", "--turn", "9"],
        ["s1", "--request", "0"],
        ["s1", "--turn", "two"],
        ["s1", "--shape", "gemini", "--request", "1"],
        ["s1", "--turn", "1", "--raw"],
        ["../nowhere/x.jsonl"],
    ],
)
def test_usage_errors_exit_2_with_one_line(cli: Callable[..., Result], argv: list[str]) -> None:
    """Bad tenants, missing ids, out-of-range turns and bad options: one line, exit 2."""
    assert_one_line_error(cli(*argv), 2)


def test_unknown_option_is_one_line_exit_2(cli: Callable[..., Result]) -> None:
    """An unknown option is a one-line usage error (reported by the top-level parser)."""
    result = cli("s1", "--bogus")
    assert (result.code, result.out, result.err.count("\n")) == (2, "", 1)
    assert result.err.startswith("gateway")
    assert "--bogus" in result.err


def test_unreadable_session_exits_1(cli: Callable[..., Result], sessions: Sessions) -> None:
    """A log that cannot be read (a directory), a bad header or an empty file: exit 1."""
    directory = sessions.data_dir / "sessions"
    (directory / "isdir.jsonl").mkdir()
    (directory / "badhead.jsonl").write_bytes(b"not a header\n")
    (directory / "empty.jsonl").write_bytes(b"")
    for argv in (["isdir"], [str(directory / "isdir.jsonl")], ["badhead"], ["empty"],
                 [str(SEED_DIR / "empty.jsonl")]):
        assert_one_line_error(cli(*argv), 1)
    listing = cli("--list")
    assert listing.code == 0
    ids = [line.split()[0] for line in listing.out.splitlines()[1:]]  # after the header
    # Header-less logs have no start time and sort after the others (by mtime among them).
    assert (ids[:3], sorted(ids[3:])) == (["t1", "torn", "s1"], ["badhead", "empty", "isdir"])


def test_replay_never_modifies_a_session(cli: Callable[..., Result], sessions: Sessions) -> None:
    """No replay command changes a log's bytes or mtime, not even a torn one's tail."""
    paths = [sessions.path("s1"), sessions.path("torn"), sessions.path("t1", "acme")]
    before = [(p.read_bytes(), p.stat().st_mtime_ns) for p in paths]
    tree = sorted(sessions.data_dir.rglob("*"))
    for argv in (["--list"], ["s1"], ["torn"], ["torn", "--json"], ["s1", "--turn", "1"],
                 ["s1", "--request", "2", "--shape", "openai"], ["t1", "--tenant", "acme"]):
        assert cli(*argv).code == 0
    assert [(p.read_bytes(), p.stat().st_mtime_ns) for p in paths] == before
    assert sorted(sessions.data_dir.rglob("*")) == tree


def test_subprocess_run_matches_in_process(cli: Callable[..., Result], sessions: Sessions) -> None:
    """``python -m gateway replay`` prints the same turn JSON and the same one-line errors."""
    def shell(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gateway", "replay", *argv, "--data-dir",
             str(sessions.data_dir)],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        )

    ok = shell("--json", "s1", "--turn", "3")
    assert (ok.returncode, ok.stderr) == (0, "")
    assert ok.stdout == cli("s1", "--turn", "3", "--json").out
    missing = shell("nosuch")
    assert_one_line_error(Result(missing.returncode, missing.stdout, missing.stderr), 2)


def test_unknown_option_is_one_line_named_after_the_subcommand(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An unknown option gives one stderr line starting 'gateway replay:' and exit 2."""
    assert main(["replay", "--list", "--bogus"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["gateway replay: unrecognized arguments: --bogus"]


def test_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`gateway replay ... | head -1` exits without a traceback when the reader leaves."""
    session = tmp_path / "big.jsonl"
    lines = [b'{"type":"session","id":"big","version":1,"startedAt":"2026-01-01T00:00:00Z"}']
    for i in range(3000):  # far more output than a pipe buffer holds
        role = "user" if i % 2 == 0 else "assistant"
        lines.append(orjson.dumps({"type": "message", "ts": "2026-01-01T00:00:01Z",
                                   "message": {"role": role, "content": f"message {i}"}}))
    session.write_bytes(b"\n".join(lines) + b"\n")
    script = (f"{sys.executable} -m gateway replay {session} --json | head -c 10 >/dev/null")
    result = subprocess.run(["bash", "-c", "set -o pipefail; " + script], capture_output=True,
                            text=True, timeout=60, check=False)
    assert "Traceback" not in result.stderr


def test_turn_is_the_old_name_of_call(cli: Callable[..., Result]) -> None:
    """--turn N (the old name) prints exactly what --call N prints, errors included."""
    assert cli("s1", "--turn", "2", "--json") == cli("s1", "--call", "2", "--json")
    assert cli("s1", "--turn", "9").err == cli("s1", "--call", "9").err
    assert "has no call 9 (it has 3)" in cli("s1", "--call", "9").err


def test_an_id_from_the_list_replays_whatever_its_tenant(cli: Callable[..., Result]) -> None:
    """An id from ``--list`` that lives in another tenant (as the web chat's live in ``web``)
    replays without ``--tenant``; with a tenant that lacks it, one line names the option that
    finds it."""
    found = cli("t1")
    assert (found.code, found.err) == (0, "")
    assert "tenant acme" in found.out.splitlines()[1]
    missing = cli("t1", "--tenant", "default")
    assert_one_line_error(missing, 2)
    assert missing.err.endswith("; it is in tenant 'acme': add --tenant acme\n")
