"""Prompt-cache breakpoints (sessions.caching): where the markers go, what they leave alone."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sessions import entries
from sessions.caching import MAX_BREAKPOINTS, CachePlan, add_breakpoints
from sessions.fingerprint import tools_fingerprint
from sessions.replay import replay_bytes
from sessions.shapes import request_body
from tests.sessions.helpers import MOOD, SOUL, call_request, make_prompt, sha16

MARK = {"type": "ephemeral"}
SECTIONS = ("You are Nova.", "## Skills\nknitting", "## Mood\ncalm")
SYSTEM = "\n\n".join(SECTIONS)
TOOLS = [{"name": "a", "input_schema": {"type": "object"}},
         {"name": "b", "input_schema": {"type": "object"}}]
MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
    {"role": "user", "content": "how are you?"},
]


def body(messages: list[dict[str, Any]] = MESSAGES, plan: CachePlan | None = None,
         tools: list[dict[str, Any]] = TOOLS) -> dict[str, Any]:
    return request_body("anthropic", SYSTEM, messages, tools, "claude-x", {"max_tokens": 9},
                        cache=plan, sections=SECTIONS)


def marks(value: Any) -> int:
    """How many blocks of a body carry cache_control."""
    if isinstance(value, dict):
        return ("cache_control" in value) + sum(marks(v) for v in value.values())
    if isinstance(value, list):
        return sum(marks(v) for v in value)
    return 0


def test_full_plan_marks_last_tool_stable_system_and_last_message() -> None:
    """Tools, the first `system` sections and the history end each get one marker; the stable
    block ends with the joiner, so the blocks' texts join to the system prompt exactly."""
    sent = body(plan=CachePlan(tools=True, system=2, history=True))
    assert sent["tools"] == [TOOLS[0], {**TOOLS[1], "cache_control": MARK}]
    assert sent["system"] == [
        {"type": "text", "text": "You are Nova.\n\n## Skills\nknitting\n\n",
         "cache_control": MARK},
        {"type": "text", "text": "## Mood\ncalm"},
    ]
    assert "".join(b["text"] for b in sent["system"]) == SYSTEM
    assert sent["messages"][:2] == MESSAGES[:2]
    assert sent["messages"][2] == {
        "role": "user",
        "content": [{"type": "text", "text": "how are you?", "cache_control": MARK}],
    }
    assert marks(sent) == 3 <= MAX_BREAKPOINTS


def test_no_plan_is_the_plain_body() -> None:
    """Without a plan (or with every part off) the body is exactly the shaped body."""
    plain = request_body("anthropic", SYSTEM, MESSAGES, TOOLS, "claude-x", {"max_tokens": 9})
    assert body() == plain
    assert body(plan=CachePlan(tools=False, system=0, history=False)) == plain
    assert marks(plain) == 0


def test_whole_prompt_stable_is_one_block() -> None:
    """When every section is stable the system prompt is one marked block, nothing after."""
    sent = body(plan=CachePlan(tools=False, system=len(SECTIONS), history=False))
    assert sent["system"] == [{"type": "text", "text": SYSTEM, "cache_control": MARK}]
    assert "cache_control" not in str(sent["tools"])


def test_markers_never_touch_the_callers_data() -> None:
    """Messages and tool schemas passed in are not modified (they are the recorded ones)."""
    messages, tools = copy.deepcopy(MESSAGES), copy.deepcopy(TOOLS)
    messages[-1] = {"role": "user", "content": [{"type": "text", "text": "x"}]}
    before = copy.deepcopy((messages, tools))
    body(messages, CachePlan(system=1), tools)
    assert (messages, tools) == before


def test_last_message_marker_skips_thinking_and_empty_content() -> None:
    """A thinking block cannot carry a marker (the block before it can); empty content none."""
    thinking = {"role": "assistant", "content": [
        {"type": "text", "text": "a"}, {"type": "thinking", "thinking": "t", "signature": "s"}]}
    sent = body([*MESSAGES, thinking], CachePlan(tools=False, history=True))
    assert sent["messages"][-1]["content"] == [
        {"type": "text", "text": "a", "cache_control": MARK},
        {"type": "thinking", "thinking": "t", "signature": "s"}]
    empty = body([{"role": "user", "content": ""}], CachePlan(tools=False, history=True))
    assert empty["messages"] == [{"role": "user", "content": ""}]


def test_sections_must_make_up_the_system_prompt() -> None:
    """A plan cut in sections that do not join to the system prompt is refused."""
    with pytest.raises(ValueError, match="do not make up"):
        add_breakpoints({"system": SYSTEM}, CachePlan(system=1), ("something else",))


def test_no_system_or_tools_means_no_marker_there() -> None:
    """A body without system prompt or tools gets only the history marker."""
    sent = request_body("anthropic", None, MESSAGES, (), "m", {}, cache=CachePlan(system=1))
    assert "system" not in sent
    assert "tools" not in sent
    assert marks(sent) == 1


@pytest.mark.parametrize(
    ("recorded", "plan"),
    [
        ({"tools": True, "system": 3, "history": False, "joined": True},
         CachePlan(True, 3, False)),
        ({"tools": False, "system": 0, "history": True, "joined": True}, CachePlan(False, 0, True)),
        ({"tools": True, "system": 3, "history": False},  # written before "joined"
         CachePlan(True, 3, False, joined=False)),
        ({"tools": True, "system": 1, "history": True, "joined": "yes"}, None),
        ({"tools": True, "system": -1, "history": True}, None),
        ({"tools": True, "system": True, "history": True}, None),
        ({"tools": "yes", "system": 1, "history": True}, None),
        ({"system": 1}, None),
        ("cache", None),
        (None, None),
    ],
)
def test_plan_from_the_log(recorded: Any, plan: CachePlan | None) -> None:
    """A recorded plan reads back; anything malformed reads as no plan."""
    assert CachePlan.from_json(recorded) == plan
    if plan is not None:
        assert plan.to_json() == recorded


def test_openai_shape_ignores_the_plan() -> None:
    """OpenAI caches prefixes by itself: its body is the same with or without a plan."""
    plain = request_body("openai", SYSTEM, MESSAGES, TOOLS, "gpt", {})
    assert request_body("openai", SYSTEM, MESSAGES, TOOLS, "gpt", {},
                        cache=CachePlan(system=2), sections=SECTIONS) == plain


def logged_call(cache: dict[str, Any] | str) -> bytes:
    """A v3 log of one call (two sections, one tool, one message) with ``cache`` recorded."""
    prompt = make_prompt(("soul", SOUL), ("mood", MOOD))
    request = call_request(prompt, ((0, 1),))
    header = {"type": "session", "version": 3, "id": "s", "startedAt": "t", "channel": "c",
              "conversation": "c", "tenant": "default"}
    call = entries.call(0, request, tools_fingerprint(request.tools))
    call["cache"] = cache
    items = [header, entries.message({"role": "user", "content": "hi"}),
             entries.section(sha16(SOUL), SOUL), entries.section(sha16(MOOD), MOOD),
             entries.prompt(prompt.fingerprint, "initial",
                            [("soul", sha16(SOUL)), ("mood", sha16(MOOD))]),
             entries.tools(tools_fingerprint(request.tools), request.tools), call]
    return b"".join(entries.encode_line(item, seq, "t") + b"\n" for seq, item in enumerate(items))


def test_replay_rebuilds_a_recorded_plan() -> None:
    """A call recorded with a plan replays to the body with exactly those markers, and its
    system prompt as shown is the join of the blocks sent."""
    replay = replay_bytes(logged_call({"tools": True, "system": 1, "history": True,
                                       "joined": True}))
    [turn] = replay.calls
    assert turn.rebuildable
    sent = replay.request(turn)
    assert sent["system"] == [{"type": "text", "text": SOUL + "\n\n", "cache_control": MARK},
                              {"type": "text", "text": MOOD}]
    assert marks(sent) == 3
    assert turn.prompt is not None
    assert replay.system_text(turn) == SOUL + "\n\n" + MOOD == turn.prompt.text
    assert turn.notes == ()


def test_an_old_glued_split_replays_as_sent_with_a_note() -> None:
    """A call recorded before the split kept its joiner rebuilds as it was sent (the two
    blocks with no blank line between them); replay shows the prompt the model read and
    says why it differs from the recorded one."""
    replay = replay_bytes(logged_call({"tools": True, "system": 1, "history": True}))
    [call] = replay.calls
    assert call.rebuildable
    sent = replay.request(call)
    assert sent["system"] == [{"type": "text", "text": SOUL, "cache_control": MARK},
                              {"type": "text", "text": MOOD}]
    assert replay.system_text(call) == SOUL + MOOD
    assert call.prompt is not None
    assert call.prompt.text == SOUL + "\n\n" + MOOD
    assert call.notes == (
        "sent with an older prompt-cache split: its system blocks left out the blank line "
        "between sections 1 (soul) and 2 (mood), so the model read them run together; the "
        "system prompt shown is the one it read, and the request is rebuilt as it was sent",)
    openai = replay.request(call, "openai")
    assert openai["messages"][0] == {"role": "system", "content": SOUL + "\n\n" + MOOD}


@pytest.mark.parametrize(
    ("cache", "why"),
    [
        ("yes", "its prompt-cache plan is malformed"),
        ({"tools": True, "system": 3, "history": True},
         "its prompt-cache plan cuts after section 3 of 2"),
    ],
)
def test_replay_refuses_a_plan_it_cannot_apply(cache: Any, why: str) -> None:
    """A malformed or impossible plan makes the call not rebuildable, never a different body."""
    [turn] = replay_bytes(logged_call(cache)).calls
    assert not turn.rebuildable
    assert turn.status_text == f"recorded but not rebuildable ({why})"
