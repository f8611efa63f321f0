"""Request shapes: the Anthropic and OpenAI bodies built from request parts, live or replayed."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessions.jsonl import JsonlSessionStore
from sessions.persist import persist_call
from sessions.replay import replay_bytes
from sessions.shapes import anthropic_body, openai_body, request_body
from tests.sessions.helpers import (
    PROMPT_A,
    TOOL_TIME,
    TOOLS_A,
    add,
    assistant,
    call_request,
    tool_result,
    tool_use,
    user,
)

HISTORY = [
    user("what time is it in Paris and Tokyo?"),
    tool_use("toolu_1", "get_time", {"tz": "Europe/Paris", "fmt": [24, "h"]}, text="Checking."),
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "14:00"},
            {"type": "tool_result", "tool_use_id": "toolu_2",
             "content": [{"type": "text", "text": "21:"}, {"type": "text", "text": "00"}]},
            {"type": "text", "text": "thanks"},
        ],
    },
    tool_use("toolu_3", "get_time", {"tz": "UTC"}),
    tool_result("toolu_3", "12:00"),
    assistant("Paris 14:00, Tokyo 21:00."),
]


def test_anthropic_body_passes_blocks_through() -> None:
    """The Anthropic body is model, params, system, messages (blocks verbatim) and tools."""
    body = anthropic_body("SYS", HISTORY, TOOLS_A, "claude-x", {"max_tokens": 100})
    assert body == {
        "model": "claude-x",
        "max_tokens": 100,
        "system": "SYS",
        "messages": HISTORY,
        "tools": [TOOL_TIME],
    }


def test_openai_body_maps_tool_use_and_tool_result() -> None:
    """OpenAI: system first, tool_use -> tool_calls (orjson arguments), tool_result -> tool."""
    body = openai_body("SYS", HISTORY, TOOLS_A, "gpt-x", {"temperature": 0.2})
    assert body == {
        "model": "gpt-x",
        "temperature": 0.2,
        "messages": [
            {"role": "system", "content": "SYS"},
            {"role": "user", "content": "what time is it in Paris and Tokyo?"},
            {"role": "assistant", "content": "Checking.", "tool_calls": [{
                "id": "toolu_1", "type": "function",
                "function": {"name": "get_time",
                             "arguments": '{"tz":"Europe/Paris","fmt":[24,"h"]}'},
            }]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "14:00"},
            {"role": "tool", "tool_call_id": "toolu_2", "content": "21:00"},
            {"role": "user", "content": "thanks"},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": "toolu_3", "type": "function",
                "function": {"name": "get_time", "arguments": '{"tz":"UTC"}'},
            }]},
            {"role": "tool", "tool_call_id": "toolu_3", "content": "12:00"},
            {"role": "assistant", "content": "Paris 14:00, Tokyo 21:00."},
        ],
        "tools": [{
            "type": "function",
            "function": {
                "name": "get_time",
                "description": "Current time in a time zone",
                "parameters": TOOL_TIME["input_schema"],
            },
        }],
    }


def test_openai_tool_without_schema_gets_empty_object_parameters() -> None:
    """A tool with no input_schema or description maps to an empty object schema."""
    body = openai_body(None, [user("x")], [{"name": "ping"}], "m", {})
    assert body["tools"] == [{"type": "function", "function": {
        "name": "ping", "description": "", "parameters": {"type": "object", "properties": {}},
    }}]


def test_no_system_and_no_tools_are_omitted() -> None:
    """An empty system prompt and an empty tool set leave those keys out of both shapes."""
    assert anthropic_body("", [user("x")], (), "m", {}) == {"model": "m", "messages": [user("x")]}
    assert openai_body(None, [user("x")], (), "m", {}) == {"model": "m", "messages": [user("x")]}


def test_unknown_shape_is_refused() -> None:
    """request_body names the known shapes when given another."""
    with pytest.raises(ValueError, match="anthropic, openai"):
        request_body("gemini", None, [], (), "m", {})  # type: ignore[arg-type]


async def test_replayed_request_equals_live_body_in_both_shapes(tmp_path: Path) -> None:
    """Replay.request rebuilds the body request_body gave at call time, for either shape."""
    store = JsonlSessionStore(tmp_path, durability="none")
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    await add(writer, *HISTORY[:5])
    request = call_request(PROMPT_A, ((0, 5),), provider="openai", model="gpt-x",
                           params={"temperature": 0.2, "max_tokens": 50})
    await persist_call(writer, request)
    await writer.aclose()
    replay = replay_bytes(writer.path.read_bytes())
    (turn,) = [t for t in replay.calls if t.entry_number == 0]  # HISTORY's own answers add turns
    for shape in ("anthropic", "openai"):
        live = request_body(shape, PROMPT_A.text, HISTORY[:5], TOOLS_A, "gpt-x",
                            {"temperature": 0.2, "max_tokens": 50})
        assert replay.request(turn, shape) == live
    assert replay.request(turn) == replay.request(turn, "openai")  # default: recorded provider
