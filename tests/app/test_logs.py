"""Log lines: JSON with UTC millisecond timestamps and the turn's context, quiet client
libraries unless the operator names them, secrets redacted, no message text at INFO."""

from __future__ import annotations

import ast
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from app import logs
from gateway.edge import logctx
from gateway.edge.errors import ProviderUnavailable
from sessions.export import records
from sessions.jsonl import JsonlSessionStore
from sessions.replay import replay_bytes
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.harness import running_core

ISO_UTC_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


class Captured:
    """What the configured handler wrote to (pytest's captured) stderr."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys

    def getvalue(self) -> str:
        return self.capsys.readouterr().err


@pytest.fixture
def captured(capsys: pytest.CaptureFixture[str]) -> Iterator[Captured]:
    """The root logger configured by each test (as `gateway run` does); restored after."""
    buffer = Captured(capsys)
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    levels = {name: logging.getLogger(name).level for name in logs.QUIET_LOGGERS}
    try:
        yield buffer
    finally:
        root.handlers[:], root.level = saved
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        logging.getLogger("gateway.test").setLevel(logging.NOTSET)


def lines(buffer: Captured) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in buffer.getvalue().splitlines()]


def test_json_line_has_utc_millisecond_time_and_bound_context(captured: Captured) -> None:
    """A JSON line carries ts (ISO 8601 UTC, ms), level, logger, message and bound fields."""
    logs.configure("json", "INFO", [])
    with logctx.bound(tenant="t1", session="s1"), logctx.bound(call=2):
        logging.getLogger("gateway.test").info("inside %s", "a turn")
    logging.getLogger("gateway.test").info("outside")
    inside, outside = lines(captured)
    assert ISO_UTC_MS.match(str(inside.pop("ts")))
    assert inside == {"level": "info", "logger": "gateway.test", "message": "inside a turn",
                      "tenant": "t1", "session": "s1", "call": "2"}
    assert set(outside) == {"ts", "level", "logger", "message"}


def test_text_line_ends_with_the_context(captured: Captured) -> None:
    """The text format puts a UTC time first and key=value context pairs at the end."""
    logs.configure("text", "INFO", [])
    with logctx.bound(conversation="web:a", session="s9"):
        logging.getLogger("gateway.test").warning("slow write")
    line = captured.getvalue().strip()
    assert ISO_UTC_MS.match(line.split(" ")[0])
    assert line.endswith("gateway.test: slow write  conversation=web:a session=s9")


def test_client_libraries_stay_quiet_unless_named(captured: Captured) -> None:
    """At DEBUG, httpx2 and openai are held at WARNING; GATEWAY_LOG_LEVELS opens one."""
    logs.configure("json", "DEBUG", [], logs.parse_levels("openai=DEBUG"))
    logging.getLogger("httpx2").debug("POST body: the user's text")
    logging.getLogger("openai").debug("Request options: ...")
    logging.getLogger("gateway.test").debug("ours")
    assert [line["logger"] for line in lines(captured)] == ["openai", "gateway.test"]


def test_bad_logger_levels_are_refused() -> None:
    """A malformed GATEWAY_LOG_LEVELS item is an error that names it."""
    with pytest.raises(ValueError, match="'httpx2' is not logger=LEVEL"):
        logs.parse_levels("httpx2")
    with pytest.raises(ValueError, match="'a=LOUD' is not logger=LEVEL"):
        logs.parse_levels("a=LOUD")


def test_secrets_are_redacted_in_json(captured: Captured) -> None:
    """A configured secret never reaches the line, even inside a formatted argument."""
    logs.configure("json", "INFO", ["sk-secret-123"])
    logging.getLogger("gateway.test").error("bad key %s", "sk-secret-123")
    assert lines(captured)[0]["message"] == "bad key ***"


async def test_a_turn_logs_no_message_text_at_info(captured: Captured, tmp_path: Path) -> None:
    """Everything a turn logs at INFO (with a tool round) names ids, never the user's text or
    the answer; lines written inside the turn carry its session."""
    logs.configure("json", "DEBUG", [])
    provider = ScriptedProvider()
    secret_text = "my blood type is AB-negative"
    provider.script(secret_text.upper())
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p") as core:
        accepted = await core.channel.say("c1", secret_text)
        await core.channel.wait_replies(1)
        await core.idle()
    assert accepted is not None
    written = lines(captured)
    assert written, "the turn logged nothing at DEBUG: the check below would prove nothing"
    for line in written:
        assert secret_text not in str(line).lower()
    assert any(line.get("session") == accepted.session_id for line in written)


async def test_lines_inside_a_turn_carry_its_trace_and_span_ids(
    captured: Captured, tmp_path: Path
) -> None:
    """JSON lines written while a turn runs carry trace_id and the span_id of what runs (the
    call, during it; else the turn), the very ids `gateway export` gives that turn's spans;
    text lines do not grow them, and lines outside a turn have none."""
    logs.configure("json", "DEBUG", [])
    provider = ScriptedProvider()
    provider.script(ProviderUnavailable("scripted: HTTP 529 overloaded_error", status=529))
    store = JsonlSessionStore(tmp_path / "d")
    async with running_core(store, provider, tmp_path / "p") as core:
        accepted = await core.channel.say("c1", "hello?")
        await core.channel.wait_replies(1)
        await core.idle()
        assert accepted is not None
        assert accepted.session_id is not None
        log = await store.read_log("default", accepted.session_id)
    written = lines(captured)
    (record,) = records(replay_bytes(log), "otlp-json")
    turn, call = record["resourceSpans"][0]["scopeSpans"][0]["spans"]
    failed = [line for line in written if str(line["message"]).startswith("provider call")]
    ended = [line for line in written if str(line["message"]).startswith("turn apologised")]
    assert [(line["trace_id"], line["span_id"]) for line in failed + ended] == [
        (call["traceId"], call["spanId"]), (turn["traceId"], turn["spanId"])]
    assert call["parentSpanId"] == turn["spanId"]
    assert all("trace_id" not in line for line in written if "session" not in line)
    logs.configure("text", "DEBUG", [])
    with logctx.bound(session="s1", trace_id="ab" * 16, span_id="cd" * 8):
        logging.getLogger("gateway.test").warning("a text line")
    assert captured.getvalue().strip().endswith("gateway.test: a text line  session=s1")


def test_one_of_our_packages_can_be_turned_up_on_its_own(captured: Captured) -> None:
    """Our loggers are named by their modules, so GATEWAY_LOG_LEVELS opens one package (the
    Telegram channel) at DEBUG while the rest stays at the configured level."""
    from channels.telegram import polling
    from gateway.agent import recorder

    try:
        logs.configure("json", "INFO", [], logs.parse_levels("channels.telegram=DEBUG"))
        polling.log.debug("getUpdates")
        recorder.log.debug("hidden")
        recorder.log.info("shown")
    finally:
        logging.getLogger("channels.telegram").setLevel(logging.NOTSET)
    assert [(line["logger"], line["level"]) for line in lines(captured)] == [
        ("channels.telegram.polling", "debug"), ("gateway.agent.recorder", "info")]


def test_no_logger_of_ours_is_named_by_hand() -> None:
    """Every logger in the product is ``logging.getLogger(__name__)`` (or a child of one): no
    string names, which drift from the modules they log for."""
    root = Path(__file__).resolve().parents[2]
    named: list[str] = []
    for package in ("gateway", "channels", "providers", "coordination", "toolsets", "sessions",
                    "app"):
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "getLogger" and node.args
                        and isinstance(node.args[0], ast.Constant)):
                    named.append(f"{path.relative_to(root)}:{node.lineno}")
    assert named == []
