"""Fuzzing the session reader: replay and resume either work or raise their documented error.

The bases are real logs: a v3 log written through the JSONL store and ``persist_call`` (tool
round, prompt change, injected message, failed call, both providers), one written by the agent
loop itself, and the seed project's v1/v2 fixtures. The fuzzer mutates them (dropped, duplicated
and reordered lines, a random JSON value in any field of any entry, spliced junk bytes and
invalid UTF-8, truncation) or starts from random bytes. ``replay_bytes`` must then either raise
:class:`~sessions.errors.SessionReadError` or return a replay whose every message, prompt and
turn renders (``replay_json``, ``call_json``, :meth:`Replay.request` in both shapes);
:meth:`JsonlSessionStore.open` must resume the file or raise a
:class:`~sessions.errors.SessionError`, and a resumed writer must keep appending.

``GATEWAY_FUZZ_EXAMPLES=10000`` raises the example count of every property here (default 200).
"""

from __future__ import annotations

import asyncio
import functools
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessions import entries
from sessions.errors import SessionError, SessionReadError
from sessions.jsonl import JsonlSessionStore
from sessions.persist import persist_call, record_outcome
from sessions.records import Injected, Outcome
from sessions.replay import NotRebuildableError, Replay, replay_bytes
from sessions.replay_json import call_json, replay_json
from sessions.shapes import SHAPES
from tests.sessions.helpers import (
    PROMPT_A,
    PROMPT_B,
    SEED_DIR,
    TOOLS_A,
    TOOLS_B,
    add,
    assistant,
    call_request,
    tool_result,
    tool_use,
    user,
)

EXAMPLES = int(os.environ.get("GATEWAY_FUZZ_EXAMPLES") or 200)
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,  # a slow example is not a failure here; a crash is
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SESSION_ID = "fuzzed"


# -- the real logs the fuzzer starts from ------------------------------------------------------


async def _write_persist_log(data_dir: Path) -> bytes:
    store = JsonlSessionStore(data_dir, durability="none")
    w = await store.create(channel="web", conversation="web:c", session_id=SESSION_ID)
    await add(w, user("héllo wörld 🌍: what time is it?"))
    await persist_call(w, call_request(PROMPT_A, ((0, 1),), tools=TOOLS_A))
    await add(w, tool_use("t1", "get_time", {"tz": "UTC"}, "one moment"))
    await record_outcome(w, Outcome(call=0, stop_reason="tool_use", usage={"input_tokens": 3},
                                    latency_ms=1.5))
    await add(w, tool_result("t1", "12:00"))
    injected = (Injected(0, user("[summary] asked the time")),)
    await persist_call(w, call_request(PROMPT_B, ((0, 3),), tools=TOOLS_B, provider="openai",
                                       reason="rebuilt:tool", injected=injected))
    await record_outcome(w, Outcome(call=1, error={"kind": "rate_limited", "message": "429"}))
    await persist_call(w, call_request(PROMPT_B, ((1, 3),), tools=TOOLS_B))
    await add(w, assistant("It is noon. 正午です。"))
    await record_outcome(w, Outcome(call=2, stop_reason="end_turn", latency_ms=12.25))
    await w.append([{"type": "reflection", "text": "future entry types are skipped"}])
    await w.aclose()
    return store.path_of("default", SESSION_ID).read_bytes()


class _Reply:
    """A reply sink that resolves once the turn has answered (or apologised)."""

    def __init__(self) -> None:
        self.done: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def typing(self) -> None:
        return None

    async def delta(self, text: str) -> None:
        return None

    async def finish(self, text: str) -> None:
        self.done.set_result(text)

    async def fail(self, text: str) -> None:
        self.done.set_result(text)


async def _write_gateway_log(root: Path) -> bytes:
    """A log written by the real agent loop (persona prompt and tools, a tool round)."""
    from app.compose_loop import build_loop
    from app.config import Settings
    from coordination.local import LocalConversations
    from gateway.delivery.registry import ConversationRegistry
    from gateway.delivery.router import Router
    from gateway.edge.messages import ConversationKey, Inbound, Sender
    from gateway.edge.metrics import Metrics
    from tests.fakes.scripted_provider import ScriptedProvider

    provider = ScriptedProvider()
    provider.script(
        {"role": "assistant", "content": [
            {"type": "text", "text": "noting"},
            {"type": "tool_use", "id": "t1", "name": "memory_write", "input": {"text": "tea"}},
        ]},
        "noted",
        "bye",
    )
    settings = Settings(_env_file=None, GATEWAY_DATA_DIR=root)  # type: ignore[call-arg]
    metrics = Metrics()
    store = JsonlSessionStore(root, durability="none")
    registry = ConversationRegistry(store, metrics)
    router = Router(registry=registry, loop=build_loop(settings, provider, metrics),
                    sink_for=lambda inbound: _Reply(), metrics=metrics,
                    conversations=LocalConversations())
    key = ConversationKey("web", "c1")
    session = None
    async with router:
        for n, text in enumerate(["remember I like tea", "goodbye"]):
            sink = _Reply()
            inbound = Inbound(key=key, sender=Sender("u1", "Ada"), text=text,
                              platform_id=f"m{n}")
            accepted = await router.deliver(inbound, sink)
            session = accepted.session_id
            await sink.done
    await registry.aclose()
    assert session is not None
    return store.path_of("default", session).read_bytes()


@functools.cache
def base_logs() -> tuple[bytes, ...]:
    """The real logs every fuzzed input starts from (built once per test run)."""
    with tempfile.TemporaryDirectory() as tmp:
        v3 = asyncio.run(_write_persist_log(Path(tmp) / "p"))
        loop_log = asyncio.run(_write_gateway_log(Path(tmp) / "g"))
    seeds = tuple(p.read_bytes() for p in sorted(SEED_DIR.glob("*.jsonl")) if p.stat().st_size)
    return (v3, loop_log, *seeds)


# -- what every fuzzed input must satisfy ------------------------------------------------------


def exercise(replay: Replay, *, strict: bool = False) -> None:
    """Touch everything a replay offers, as the CLI, the viewer and the exporters do.

    :meth:`Replay.request` refuses a turn it cannot rebuild (NotRebuildableError), and may
    refuse one whose recorded blocks cannot take a shape, with the documented
    SessionReadError; ``strict`` (for unmutated logs) allows only the first kind.
    """
    for i, message in enumerate(replay.messages):
        assert isinstance(message, dict)
        replay.messages.entry(i)
    for version in replay.prompts:
        assert version.number >= 1
        assert isinstance(version.fingerprint, str)
        for ref in version.sections:
            assert isinstance(ref.hash, str)
    for turn in replay.calls:
        replay.sent(turn)
        replay.tools_of(turn)
        replay.outcome_of(turn)
        orjson.dumps(call_json(replay, turn))
        for shape in (None, *SHAPES):
            if not turn.rebuildable:  # never a body for a call replay cannot rebuild
                with pytest.raises(NotRebuildableError):
                    replay.request(turn, shape)
                continue
            try:
                body = replay.request(turn, shape)
            except SessionReadError:
                assert not strict, f"turn {turn.index} refused in a clean log"
                continue
            orjson.dumps(body)
    for problem in replay.problems:
        assert problem.line >= 1
        assert problem.message
    orjson.dumps(replay_json(replay))
    assert isinstance(replay.session_id, str)


def check_replay(data: bytes, *, strict: bool = False) -> Replay | None:
    """Replay ``data``: the documented error, or a replay that renders completely."""
    try:
        replay = replay_bytes(data)
    except SessionReadError:
        return None
    exercise(replay, strict=strict)
    return replay


async def check_resume(data_dir: Path, data: bytes) -> None:
    """Resume ``data`` as a session: a SessionError, or a writer that appends readable entries."""
    store = JsonlSessionStore(data_dir, durability="none")
    path = store.path_of("default", SESSION_ID)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    try:
        writer = await store.open("default", SESSION_ID)
    except SessionError:
        assert path.read_bytes() == data  # a log it refuses to resume is left untouched
        return
    try:
        await writer.append([entries.message(user("after resume"))])
        await persist_call(writer, call_request(PROMPT_A, ((0, writer.state.message_count),)))
        await record_outcome(writer, Outcome(call=writer.state.call_count - 1,
                                             stop_reason="end_turn"))
    finally:
        await writer.aclose()
    resumed = check_replay(path.read_bytes())
    assert resumed is not None, "a log that resumes must replay"
    assert resumed.messages[-1] == user("after resume")


@pytest.fixture(scope="module")
def runner() -> Iterator[asyncio.Runner]:
    """One event loop for every resume example (a loop per example would dominate the time)."""
    with asyncio.Runner() as loop_runner:
        yield loop_runner


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


# -- strategies ----------------------------------------------------------------------------------

# Text without lone surrogates (orjson cannot write them; invalid UTF-8 is spliced as bytes).
text = st.text(st.characters(codec="utf-8"), max_size=20)
edge_ints = st.sampled_from([
    0, -1, 1, 2, 3, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63),
])
scalars = (st.none() | st.booleans() | edge_ints | st.integers()
           .filter(lambda n: -(2**63) <= n < 2**64)
           | st.floats(allow_nan=False, allow_infinity=False) | text)
json_value = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)
# Values shaped like the real ones, so deeper checks (windows, blocks, tool schemas) are reached.
plausible = st.one_of(
    json_value,
    st.lists(st.lists(edge_ints | st.integers(-2, 8), min_size=0, max_size=3), max_size=3),
    st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "tool_use", "tool_result"])},
                                    optional={"text": json_value, "id": json_value,
                                              "name": json_value, "input": json_value,
                                              "tool_use_id": json_value,
                                              "content": json_value}), max_size=3),
    st.fixed_dictionaries({"role": json_value, "content": json_value}),
    st.lists(st.fixed_dictionaries({"position": json_value, "message": json_value}), max_size=2),
    st.lists(st.fixed_dictionaries({}, optional={"name": json_value, "description": json_value,
                                                 "input_schema": json_value}), max_size=2),
)

Path_ = tuple[str | int, ...]


def paths(value: Any, prefix: Path_ = ()) -> Iterator[Path_]:
    """Every key and index path inside a parsed entry (the entry itself excluded)."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield (*prefix, key)
            yield from paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield (*prefix, index)
            yield from paths(inner, (*prefix, index))


def set_path(entry: Any, path: Path_, value: Any, *, delete: bool = False) -> None:
    target = entry
    for step in path[:-1]:
        target = target[step]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value


ENTRY_KEYS = ("type", "seq", "ts", "version", "id", "message", "role", "content", "hash", "text",
              "fingerprint", "sections", "joiner", "reason", "tools", "call", "prompt", "window",
              "injected", "params", "provider", "model", "usage", "error", "latency_ms",
              "stop_reason")


@st.composite
def mutate_field(draw: st.DrawFn, lines: list[bytes]) -> list[bytes]:
    """A random JSON value (or a deletion) at any field, at any depth, of one entry."""
    index = draw(st.integers(0, len(lines) - 1))
    try:
        entry = orjson.loads(lines[index])
    except orjson.JSONDecodeError:
        return lines
    if not isinstance(entry, dict):
        return lines
    found = list(paths(entry))
    choice = draw(st.sampled_from([*found, *((key,) for key in ENTRY_KEYS)]))
    if choice in found and draw(st.booleans()) and len(choice) > 0:
        set_path(entry, choice, None, delete=True)
    else:
        set_path(entry, choice, draw(plausible))
    out = list(lines)
    out[index] = orjson.dumps(entry)
    return out


@st.composite
def mutate_lines(draw: st.DrawFn, lines: list[bytes]) -> list[bytes]:
    """Drop, duplicate, move or replace lines; splice junk bytes into one."""
    out = list(lines)
    n = len(out)
    kind = draw(st.sampled_from(["drop", "dup", "swap", "shuffle", "replace", "splice"]))
    i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
    if kind == "drop" and n > 1:
        del out[i]
    elif kind == "dup":
        out.insert(j, out[i])
    elif kind == "swap":
        out[i], out[j] = out[j], out[i]
    elif kind == "shuffle":
        out = draw(st.permutations(out))
    elif kind == "replace":
        out[i] = draw(st.one_of(st.binary(max_size=40),
                                json_value.map(orjson.dumps)))
    else:
        junk = draw(st.one_of(
            st.binary(min_size=1, max_size=12),
            st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x00",
                             b"\r", b"\n", b'"', b"\\", b"\\ud800", b"}", b"{"]),
        ))
        at = draw(st.integers(0, len(out[i])))
        out[i] = out[i][:at] + junk + out[i][at:]
    return out


@st.composite
def fuzzed_log(draw: st.DrawFn) -> bytes:
    """A real log after one to five mutations, maybe truncated, maybe without its last newline."""
    base = draw(st.sampled_from(base_logs()))
    lines = base.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    for _ in range(draw(st.integers(1, 5))):
        lines = draw(mutate_field(lines)) if draw(st.booleans()) else draw(mutate_lines(lines))
        if not lines:
            lines = [b""]
    data = b"\n".join(lines) + (b"\n" if draw(st.booleans()) or len(lines) < 2 else b"")
    if draw(st.integers(0, 4)) == 0:
        data = data[: draw(st.integers(0, len(data)))]
    return data


def header_then(body: bytes) -> bytes:
    return orjson.dumps(entries.header(SESSION_ID, "2026-01-01T00:00:00.000Z", tenant="default",
                                       channel="web", conversation="web:c")) + b"\n" + body


random_input = st.one_of(
    st.binary(max_size=600),
    st.binary(max_size=600).map(header_then),
    st.lists(json_value.map(orjson.dumps), max_size=6).map(b"\n".join).map(header_then),
)


# -- properties ----------------------------------------------------------------------------------


@FUZZ
@given(data=fuzzed_log())
def test_mutated_real_logs_replay_or_raise_the_documented_error(data: bytes) -> None:
    """Mutated real logs replay and render completely, or raise SessionReadError."""
    check_replay(data)


@FUZZ
@given(data=random_input)
def test_random_bytes_replay_or_raise_the_documented_error(data: bytes) -> None:
    """Random bytes (bare, or after a valid header) replay and render, or raise SessionReadError."""
    check_replay(data)


@FUZZ
@given(data=st.one_of(fuzzed_log(), random_input))
def test_fuzzed_logs_resume_or_raise_a_session_error(
    runner: asyncio.Runner, scratch: Path, data: bytes
) -> None:
    """Resuming a fuzzed log raises a SessionError, or gives a writer whose appends replay."""
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        runner.run(check_resume(Path(tmp), data))


def cut_points(base: bytes) -> list[int]:
    """Every byte offset when fuzzing hard; otherwise each class of offset on every line: at
    its start, one byte in, the middle, before its closing brace, before and after its newline,
    and inside its first multi-byte UTF-8 character."""
    if EXAMPLES >= 1000:
        return list(range(len(base) + 1))
    cuts = {0, len(base)}
    start = 0
    while start < len(base):
        end = base.find(b"\n", start)
        end = len(base) if end == -1 else end
        cuts.update({start, start + 1, (start + end) // 2, end - 1, end, end + 1})
        lead = next((i for i in range(start, end) if base[i] >= 0xC0), None)
        if lead is not None:
            cuts.add(lead + 1)
        start = end + 1
    return sorted(c for c in cuts if 0 <= c <= len(base))


def test_truncations_of_the_real_logs_replay_without_problems() -> None:
    """A log cut at any byte offset replays with no new problem; only the cut line is lost."""
    for base in base_logs():
        header_end = base.index(b"\n") + 1
        whole = check_replay(base, strict=True)
        assert whole is not None
        turns_before = 0
        for offset in cut_points(base):
            cut = base[:offset]
            replay = check_replay(cut, strict=True)
            if offset < header_end:
                assert replay is None, offset
                continue
            assert replay is not None, offset
            assert replay.torn_tail is not cut.endswith(b"\n"), offset
            complete = cut.count(b"\n")
            assert replay.problems == tuple(p for p in whole.problems if p.line <= complete), offset
            assert len(replay.calls) >= turns_before, offset
            turns_before = len(replay.calls)


def test_truncations_of_the_v3_logs_resume_cleanly(runner: asyncio.Runner, scratch: Path) -> None:
    """A v3 log cut at any offset after its header resumes; what is appended replays cleanly."""
    for base in base_logs()[:2]:
        header_end = base.index(b"\n") + 1
        for offset in (c for c in cut_points(base) if c >= header_end):
            with tempfile.TemporaryDirectory(dir=scratch) as tmp:
                data_dir = Path(tmp)
                runner.run(check_resume(data_dir, base[:offset]))
                path = JsonlSessionStore(data_dir).path_of("default", SESSION_ID)
                after = replay_bytes(path.read_bytes())
            assert after.problems == (), offset
            assert not after.torn_tail, offset


HUGE = 4 * 1024 * 1024


@pytest.mark.parametrize("shape", ["message", "junk", "torn", "section", "params", "deep"])
def test_huge_lines_replay(shape: str) -> None:
    """Lines of several MB (a message, junk, a torn tail, a section, params, deep nesting)."""
    base = base_logs()[0]
    big = "x" * HUGE
    lines = {
        "message": orjson.dumps({"type": "message", "seq": 99,
                                 "message": {"role": "user", "content": big}}) + b"\n",
        "junk": b"\xff" * HUGE + b"\n",
        "torn": b'{"type":"message","message":{"role":"user","content":"' + b"y" * HUGE,
        "section": orjson.dumps({"type": "section", "hash": "0" * 16, "text": big}) + b"\n",
        "params": orjson.dumps({"type": "call", "call": 7, "window": [[0, 1]],
                                "params": {"k": big}}) + b"\n",
        "deep": b"[" * (HUGE // 4) + b"]" * (HUGE // 4) + b"\n",
    }
    replay = check_replay(base + lines[shape])
    assert replay is not None
    if shape == "message":
        assert replay.messages[-1]["content"] == big
    if shape == "torn":
        assert replay.torn_tail


def test_invalid_utf8_inside_strings_is_a_problem_not_a_crash() -> None:
    """Invalid UTF-8 inside a JSON string of a middle line is reported with its line number."""
    base = base_logs()[0]
    lines = base.split(b"\n")
    lines[1] = lines[1].replace(b"h\xc3\xa9llo", b"h\xc3llo")
    replay = check_replay(b"\n".join(lines))
    assert replay is not None
    assert [(p.line, p.message) for p in replay.problems][:1] == [(2, "not valid JSON")]
