"""``gateway replay ID --rerun N``: each tool call of the rerun gets the result recorded for the
same call of its own round (matched by round and tool-use id, the arguments compared as
canonical JSON), and a call whose arguments differ is reported, never given that result."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.commands.rerun_tools import MISMATCH, MISSING, RECORDED, RecordedRounds, canonical
from sessions.jsonl import JsonlSessionStore
from sessions.persist import persist_call
from sessions.replay import replay_bytes
from tests.app.cli.test_rerun import acli, anthropic_env
from tests.fakes.providers import FakeProviderServer, Reply, ToolCall
from tests.sessions.helpers import PROMPT_A, add, assistant, call_request, tool_result, tool_use

__all__ = ["anthropic_env"]  # the fixture, used by name

CLOCK = {"name": "clock", "description": "The time in a zone.",
         "input_schema": {"type": "object", "properties": {"tz": {"type": "string"},
                                                           "format": {"type": "string"}}}}
RECORDED_ARGS = {"tz": "Europe/Paris", "format": "24h"}
REORDERED = {"format": "24h", "tz": "Europe/Paris"}


async def two_rounds(data: Path) -> str:
    """One turn that asked the clock twice, in two rounds, and got two different times; the
    session id. Calls: 1 asks (round 0), 2 asks again (round 1), 3 answers."""
    store = JsonlSessionStore(data, durability="none")
    writer = await store.create(channel="web", conversation="c", session_id="s1")
    await add(writer, {"role": "user", "content": "what time is it in Paris, twice?"})
    await persist_call(writer, call_request(PROMPT_A, ((0, 1),), tools=(CLOCK,)))
    await add(writer, tool_use("toolu_rec_1", "clock", RECORDED_ARGS), tool_result("toolu_rec_1",
                                                                                    "10:00"))
    await persist_call(writer, call_request(PROMPT_A, ((0, 3),), tools=(CLOCK,)))
    await add(writer, tool_use("toolu_rec_2", "clock", RECORDED_ARGS), tool_result("toolu_rec_2",
                                                                                    "10:05"))
    await persist_call(writer, call_request(PROMPT_A, ((0, 5),), tools=(CLOCK,)))
    await add(writer, assistant("It was 10:00, then 10:05."))
    await writer.aclose()
    await store.aclose()
    return "s1"


def last_result(body: dict[str, Any]) -> Any:
    """The content of the tool result the body's last message carries."""
    (block,) = [b for b in body["messages"][-1]["content"] if b.get("type") == "tool_result"]
    return block["content"]


async def test_the_same_tool_in_two_rounds_gets_each_rounds_own_result(
    tmp_path: Path, anthropic_env: pytest.MonkeyPatch
) -> None:
    """Rerun of call 1 asks the clock in round 0 and again in round 1 (its arguments' keys in
    another order, fresh tool-use ids): round 0 is sent 10:00 and round 1 10:05, as recorded,
    never the first result twice."""
    data = tmp_path / "data"
    session = await two_rounds(data)
    async with FakeProviderServer() as srv:
        anthropic_env.setenv("ANTHROPIC_BASE_URL", srv.anthropic_base_url)
        srv.script("anthropic", Reply.tool_uses(ToolCall("clock", REORDERED)),
                   Reply.tool_uses(ToolCall("clock", REORDERED)), Reply.text("10:00, 10:05."))
        code, out, err = await acli(data, session, "--rerun", "1", "--json")
        bodies = [r.body for r in srv.requests]
    assert (code, err) == (0, "")
    assert len(bodies) == 3
    assert [last_result(b) for b in bodies[1:]] == ["10:00", "10:05"]
    view = orjson.loads(out)
    steps = [[(c["round"], c["source"], c["result"], c["recordedCall"]["id"])
              for c in step["toolCalls"]] for step in view["steps"][:2]]
    assert steps == [[(0, RECORDED, "10:00", "toolu_rec_1")],
                     [(1, RECORDED, "10:05", "toolu_rec_2")]]
    assert view["steps"][2]["assistant"]["content"][0]["text"] == "10:00, 10:05."


async def test_arguments_that_differ_are_reported_not_filled(
    tmp_path: Path, anthropic_env: pytest.MonkeyPatch
) -> None:
    """The rerun asks the clock for Tokyo where the recorded round asked for Paris: the call
    is shown as not executed, with the recorded call's arguments, and the rerun stops there
    (no second request carrying Paris's time as Tokyo's)."""
    data = tmp_path / "data"
    session = await two_rounds(data)
    async with FakeProviderServer() as srv:
        anthropic_env.setenv("ANTHROPIC_BASE_URL", srv.anthropic_base_url)
        srv.script("anthropic", Reply.tool_uses(ToolCall("clock", {"tz": "Asia/Tokyo"})))
        code, out, err = await acli(data, session, "--rerun", "1")
        sent = len(srv.requests)
    assert (code, err) == (0, "")
    assert sent == 1
    assert ("[tool call, NOT executed: the recorded call of clock in this round (toolu_rec_1) "
            'had other arguments] clock {"tz":"Asia/Tokyo"}\n'
            '  recorded arguments: {"tz":"Europe/Paris","format":"24h"}\n') in out
    assert "10:00" not in out.split("--- new answer", 1)[1]


def test_matching_is_by_round_then_id_then_tool_and_arguments(tmp_path: Path) -> None:
    """In a round: the same id answers (if its tool and arguments agree, keys in any order),
    else the first unused recorded call with the same tool and arguments; each answers once;
    a round that did not call the tool has nothing for it."""
    data = tmp_path / "data"
    asyncio.run(two_rounds(data))
    replay = replay_bytes((data / "sessions" / "s1.jsonl").read_bytes())
    rounds = RecordedRounds(replay, replay.call(1))
    assert [[(u.id, u.content) for u in r] for r in rounds.rounds] == [
        [("toolu_rec_1", "10:00")], [("toolu_rec_2", "10:05")]]
    source, found = rounds.match(1, "toolu_rec_2", "clock", REORDERED)
    assert (source, found and found.content) == (RECORDED, "10:05")
    assert rounds.match(1, "toolu_new", "clock", REORDERED) == (MISSING, None)  # used once
    assert rounds.match(2, "toolu_new", "clock", RECORDED_ARGS) == (MISSING, None)
    source, found = rounds.match(0, "toolu_rec_1", "clock", {"tz": "UTC"})
    assert (source, found and found.id) == (MISMATCH, "toolu_rec_1")
    source, found = rounds.match(0, "toolu_other", "clock", REORDERED)
    assert (source, found and found.content) == (RECORDED, "10:00")
    from_call_2 = RecordedRounds(replay, replay.call(2))
    assert [[u.content for u in r] for r in from_call_2.rounds] == [["10:05"]]
    assert canonical(REORDERED) == canonical(RECORDED_ARGS) == \
        '{"format":"24h","tz":"Europe/Paris"}'
