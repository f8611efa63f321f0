"""Property: replay rebuilds, for every recorded call, the exact body the provider was sent.

Message contents range over everything JSON can decode to (integers past 64 bits, NaN and
the infinities, lone surrogates), which the log must record exactly (sessions.encoding).

Random sessions are written through the real JSONL store and ``persist_call``: user and
assistant messages, tool rounds, section and tool-set changes (including back to earlier ones),
windows that drop old messages, injected messages, outcomes, and close + reopen (resume). At each
call the test records the request body built from the live data with ``request_body``; replaying
the file must give the same body for that call, in both shapes.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessions import entries
from sessions.encoding import dumps, loads_entry
from sessions.jsonl import JsonlSessionStore, JsonlSessionWriter
from sessions.persist import persist_call, record_outcome
from sessions.records import CallRequest, Injected, MessageDict, Outcome, Prompt, Section, Window
from sessions.replay import replay_bytes
from sessions.shapes import SHAPES, Shape, request_body

SECTION_NAMES = ("soul", "user", "memory", "mood")
SECTION_POOL = ("You are Lisa.", "## Memory\n- tea", "## Memory\n- tea\n- short answers", "")

text = st.text(st.characters(codec="utf-8"), max_size=30)  # prompt text: files are UTF-8
section_text = st.one_of(st.sampled_from(SECTION_POOL), text)
# What a provider's or a platform's JSON can decode to: lone surrogates ("\ud83d" escapes),
# integers past 64 bits, NaN and the infinities. The log must keep all of it exactly.
lone = st.sampled_from(["\ud800", "\udfff", "\ud83d", "\ude00"])
wild_text = st.one_of(text, st.builds(lambda a, s, b: a + s + b, text, lone, text))
json_value = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(-(2**200), 2**200)
    | st.floats()
    | wild_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(wild_text, inner, max_size=3),
    max_leaves=6,
)
params = st.fixed_dictionaries(
    {"max_tokens": st.integers(1, 8192)},
    optional={
        "temperature": st.floats(0, 2, allow_nan=False),
        "stop": st.lists(text, max_size=2),
    },
)

TOOL_1 = {"name": "get_time", "description": "time", "input_schema": {"type": "object"}}
TOOL_2 = {"name": "memory_write", "input_schema": {"type": "object", "properties": {}}}
TOOL_1B = {"name": "get_time", "description": "time in a zone", "input_schema": {"type": "object"}}
TOOL_POOL: tuple[tuple[dict[str, Any], ...], ...] = (
    (), (TOOL_1,), (TOOL_1, TOOL_2), (TOOL_2, TOOL_1), (TOOL_1B,),
)

OPERATIONS = (
    ["user"] * 4 + ["assistant"] * 2 + ["tool_round"] * 2 + ["call"] * 5
    + ["section", "tools", "outcome", "reopen"]
)


@dataclass
class Live:
    """What the agent loop holds in memory while it writes the session."""

    writer: JsonlSessionWriter
    messages: list[MessageDict] = field(default_factory=list)
    sections: dict[str, str] = field(default_factory=dict)
    tools: tuple[dict[str, Any], ...] = ()
    calls: int = 0
    expected: dict[int, dict[Shape, dict[str, Any]]] = field(default_factory=dict)

    def prompt(self) -> Prompt:
        return Prompt.from_sections([Section(n, self.sections[n]) for n in SECTION_NAMES])


def draw_window(data: st.DataObject, n: int) -> Window:
    """Full history, a dropped prefix, or a few arbitrary (possibly empty) ranges."""
    full: Window = ((0, n),)
    bound = st.integers(0, n)
    ranges = st.lists(st.tuples(bound, bound), max_size=3).map(
        lambda pairs: tuple((min(a, b), max(a, b)) for a, b in pairs)
    )
    return data.draw(st.one_of(st.just(full), bound.map(lambda k: ((k, n),)), ranges))


def draw_sent(
    data: st.DataObject, windowed: list[MessageDict]
) -> tuple[list[MessageDict], tuple[Injected, ...]]:
    """The agent's final message list: windowed messages with summaries placed among them.

    Built directly (not with ``window_messages``): each injected message's position is simply
    its index in the final list.
    """
    count = data.draw(st.integers(0, 2))
    total = len(windowed) + count
    slots = sorted(data.draw(st.sets(st.integers(0, total - 1), min_size=count, max_size=count))
                   if total else set())
    rest = iter(windowed)
    sent: list[MessageDict] = []
    injected: list[Injected] = []
    for position in range(total):
        if position in slots:
            message = {"role": "user", "content": f"[summary] {data.draw(text)}"}
            injected.append(Injected(position, message))
            sent.append(message)
        else:
            sent.append(next(rest))
    return sent, tuple(injected)


async def step(live: Live, op: str, data: st.DataObject, store: JsonlSessionStore) -> None:
    writer = live.writer
    if op == "user":
        message: MessageDict = {"role": "user", "content": data.draw(wild_text)}
        await writer.append([entries.message(message)])
        live.messages.append(message)
    elif op == "assistant":
        message = {"role": "assistant",
                   "content": [{"type": "text", "text": data.draw(wild_text)}]}
        await writer.append([entries.message(message)])
        live.messages.append(message)
    elif op == "tool_round":
        call_id = f"toolu_{len(live.messages)}"
        use: MessageDict = {"role": "assistant", "content": [
            {"type": "text", "text": data.draw(text)},
            {"type": "tool_use", "id": call_id, "name": data.draw(st.sampled_from(["a", "b"])),
             "input": data.draw(st.dictionaries(wild_text, json_value, max_size=3))},
        ]}
        result: MessageDict = {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call_id, "content": data.draw(wild_text)},
        ]}
        await writer.append([entries.message(use), entries.message(result)])
        live.messages.extend([use, result])
    elif op == "section":
        live.sections[data.draw(st.sampled_from(SECTION_NAMES))] = data.draw(section_text)
    elif op == "tools":
        chosen = data.draw(st.sampled_from(TOOL_POOL))
        # Sometimes an equal set in a new object, as a rebuilt tool list would be.
        live.tools = tuple(dict(t) for t in chosen) if data.draw(st.booleans()) else chosen
    elif op == "call":
        await make_call(live, data)
    elif op == "outcome" and live.calls:
        await record_outcome(writer, Outcome(call=live.calls - 1, stop_reason="end_turn"))
    elif op == "reopen":
        await writer.aclose()
        live.writer = await store.open(writer.tenant, writer.session_id)


async def make_call(live: Live, data: st.DataObject) -> None:
    window = draw_window(data, len(live.messages))
    windowed = [m for start, end in window for m in live.messages[start:end]]
    sent, injected = draw_sent(data, windowed)
    prompt = live.prompt()
    provider = data.draw(st.sampled_from(["anthropic", "openai"]))
    model = data.draw(st.sampled_from(["claude-test", "gpt-test"]))
    call_params = data.draw(params)
    request = CallRequest(
        prompt=prompt, reason="rebuilt" if live.calls else "initial", tools=live.tools,
        provider=provider, model=model, params=call_params, window=window, injected=injected,
    )
    # What the provider receives, built from live objects before anything is written.
    bodies = {
        shape: copy.deepcopy(request_body(shape, prompt.text, sent, live.tools, model,
                                          call_params))
        for shape in SHAPES
    }
    report = await persist_call(live.writer, request)
    assert report.call == live.calls
    live.expected[report.call] = bodies
    live.calls += 1


async def write_random_session(data: st.DataObject, directory: Path) -> Live:
    store = JsonlSessionStore(directory, durability="none")
    writer = await store.create(channel="console", conversation="prop", session_id="prop")
    live = Live(writer=writer, tools=data.draw(st.sampled_from(TOOL_POOL)))
    live.sections = {name: data.draw(section_text) for name in SECTION_NAMES}
    try:
        for _ in range(data.draw(st.integers(1, 40))):
            await step(live, data.draw(st.sampled_from(OPERATIONS)), data, store)
        await make_call(live, data)  # at least one call per session
    finally:
        await live.writer.aclose()
    return live


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_replay_rebuilds_every_recorded_request(
    data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """For random sessions, replay.request(turn, shape) equals the live body of every call."""
    directory = tmp_path_factory.mktemp("roundtrip")
    live = asyncio.run(write_random_session(data, directory))
    log = (directory / "sessions" / "prop.jsonl").read_bytes()
    replay = replay_bytes(log)

    assert (replay.problems, replay.torn_tail) == ((), False)
    by_call = {t.entry_number: t for t in replay.calls if t.entry_number is not None}
    assert sorted(by_call) == sorted(live.expected)
    for call, bodies in live.expected.items():
        turn = by_call[call]
        assert turn.prompt is not None
        assert turn.prompt.verified
        for shape, body in bodies.items():
            # Compared as exact JSON text: NaN never equals itself, and 1 == 1.0 == True.
            assert dumps(replay.request(turn, shape)) == dumps(body), (call, shape)

    # Content-addressed entries are written once per session, even across resumes, and a
    # prompt entry only when the fingerprint differs from the previous prompt entry.
    lines = [loads_entry(raw) or {} for raw in log.splitlines()]
    section_hashes = [e["hash"] for e in lines if e["type"] == "section"]
    tool_fps = [e["fingerprint"] for e in lines if e["type"] == "tools"]
    prompt_fps = [e["fingerprint"] for e in lines if e["type"] == "prompt"]
    assert len(section_hashes) == len(set(section_hashes))
    assert len(tool_fps) == len(set(tool_fps))
    assert all(a != b for a, b in itertools.pairwise(prompt_fps))
    assert [e["seq"] for e in lines] == list(range(len(lines)))
