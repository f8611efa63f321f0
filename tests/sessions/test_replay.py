"""Replay of v3 logs: calls, prompts in effect, windows, failures, problems and verification."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from sessions import entries
from sessions.errors import CorruptHeaderError, EmptySessionError, SessionReadError
from sessions.jsonl import JsonlSessionStore, JsonlSessionWriter
from sessions.persist import persist_call, record_outcome
from sessions.records import Injected, Outcome
from sessions.replay import (
    NOTICE_CALL_UNRECORDED,
    NOTICE_PROMPT_MISSING,
    Call,
    Problem,
    Replay,
    replay_bytes,
)
from sessions.replay_json import call_json, replay_json
from sessions.shapes import request_body
from tests.sessions.helpers import (
    MEMORY_1,
    MOOD,
    PROMPT_A,
    PROMPT_B,
    SOUL,
    TOOLS_A,
    add,
    assistant,
    call_request,
    sha16,
    tool_result,
    tool_use,
    user,
)

U1, A1, U2, A2 = user("hello"), assistant("hi there"), user("what's new?"), assistant("not much")


@pytest.fixture
def store(tmp_path: Path) -> JsonlSessionStore:
    return JsonlSessionStore(tmp_path / "data", durability="none")


async def new_writer(store: JsonlSessionStore) -> JsonlSessionWriter:
    return await store.create(channel="console", conversation="c", session_id="s1")


def replay_file(path: Path) -> Replay:
    return replay_bytes(path.read_bytes())


def call_numbered(replay: Replay, call: int) -> Call:
    """The call opened by call entry ``call`` (history written without calls adds others)."""
    (turn,) = [t for t in replay.calls if t.entry_number == call]
    return turn


async def basic_session(store: JsonlSessionStore) -> Path:
    """Two plain turns. Lines: 1 header, 2 U1, 3-5 sections, 6 prompt, 7 tools, 8 call 0,
    9 A1, 10 outcome 0, 11 U2, 12 call 1, 13 A2, 14 outcome 1."""
    writer = await new_writer(store)
    await add(writer, U1)
    await persist_call(writer, call_request(PROMPT_A, ((0, 1),)))
    await add(writer, A1)
    await record_outcome(writer, Outcome(call=0, stop_reason="end_turn"))
    await add(writer, U2)
    await persist_call(writer, call_request(PROMPT_A, ((0, 3),)))
    await add(writer, A2)
    await record_outcome(writer, Outcome(call=1, stop_reason="end_turn"))
    await writer.aclose()
    return writer.path


def edit_lines(path: Path, edit: dict[int, bytes | None], *, insert_after: int = 0,
               extra: bytes = b"") -> None:
    """Rewrite 1-based lines (None deletes one); optionally insert ``extra`` after a line."""
    lines = path.read_bytes().splitlines()
    out: list[bytes] = []
    for number, raw in enumerate(lines, start=1):
        replacement = edit.get(number, raw)
        if replacement is not None:
            out.append(replacement)
        if number == insert_after:
            out.append(extra)
    path.write_bytes(b"\n".join(out) + b"\n")


# -- turns ---------------------------------------------------------------------------------------


async def test_each_turn_sees_only_earlier_messages(store: JsonlSessionStore) -> None:
    """Call n is sent exactly the messages before its call; its assistant message comes after."""
    replay = replay_file(await basic_session(store))
    assert [replay.sent(t) for t in replay.calls] == [[U1], [U1, A1, U2]]
    assert [replay.messages[t.assistant] for t in replay.calls if t.assistant is not None] == [
        A1, A2,
    ]
    assert [(t.index, t.entry_number, t.provider, t.model) for t in replay.calls] == [
        (1, 0, "anthropic", "claude-test"), (2, 1, "anthropic", "claude-test"),
    ]
    assert (replay.version, replay.problems, replay.notice, replay.torn_tail) == (
        3, (), None, False,
    )


async def test_mid_session_rebuild_applies_from_the_next_turn(store: JsonlSessionStore) -> None:
    """A prompt rebuilt after turn 2 is the prompt of turns 3 and 4, never of turns 1 and 2."""
    writer = await new_writer(store)
    for number, prompt in enumerate([PROMPT_A, PROMPT_A, PROMPT_B, PROMPT_B]):
        await add(writer, user(f"q{number}"))
        reason = "initial" if number == 0 else "rebuilt"
        await persist_call(writer, call_request(prompt, ((0, 2 * number + 1),), reason=reason))
        await add(writer, assistant(f"a{number}"))
    await writer.aclose()
    replay = replay_file(writer.path)
    assert [t.prompt.text if t.prompt else None for t in replay.calls] == [
        PROMPT_A.text, PROMPT_A.text, PROMPT_B.text, PROMPT_B.text,
    ]
    assert [(v.number, v.fingerprint, v.reason, v.first_call, v.verified)
            for v in replay.prompts] == [
        (1, PROMPT_A.fingerprint, "initial", 1, True),
        (2, PROMPT_B.fingerprint, "rebuilt", 3, True),
    ]


async def test_timeline_first_turns_including_a_prompt_without_turn(
    store: JsonlSessionStore,
) -> None:
    """A -> B -> A gives first turns 1, 2, 3; a prompt entry no call used has first turn None."""
    writer = await new_writer(store)
    await add(writer, U1)
    for prompt in (PROMPT_A, PROMPT_B, PROMPT_A):
        await persist_call(writer, call_request(prompt, ((0, 1),), reason="rebuilt"))
    late = "## Mood\nsleepy"
    await writer.append([
        entries.section(sha16(late), late),
        entries.prompt(sha16(late), "rebuilt", [("mood", sha16(late))]),
    ])
    await writer.aclose()
    replay = replay_file(writer.path)
    assert [(v.fingerprint, v.first_call) for v in replay.prompts] == [
        (PROMPT_A.fingerprint, 1), (PROMPT_B.fingerprint, 2), (PROMPT_A.fingerprint, 3),
        (sha16(late), None),
    ]
    assert [t.prompt.number if t.prompt else None for t in replay.calls] == [1, 2, 3]
    assert replay.prompts[-1].text == late


async def test_tool_round_is_two_turns(store: JsonlSessionStore) -> None:
    """tool_use then tool_result then the final answer: two calls, two turns."""
    call, result = tool_use("toolu_1", "get_time", {"tz": "UTC"}), tool_result("toolu_1", "12:00")
    final = assistant("It is noon.")
    writer = await new_writer(store)
    await add(writer, U1)
    await persist_call(writer, call_request(PROMPT_A, ((0, 1),)))
    await add(writer, call, result)
    await record_outcome(writer, Outcome(call=0, stop_reason="tool_use"))
    await persist_call(writer, call_request(PROMPT_A, ((0, 3),)))
    await add(writer, final)
    await record_outcome(writer, Outcome(call=1, stop_reason="end_turn"))
    await writer.aclose()

    replay = replay_file(writer.path)
    assert [replay.sent(t) for t in replay.calls] == [[U1], [U1, call, result]]
    assert [t.assistant for t in replay.calls] == [1, 3]
    stops = [o.stop_reason for t in replay.calls if (o := replay.outcome_of(t)) is not None]
    assert stops == ["tool_use", "end_turn"]


async def test_windows_that_drop_old_messages_replay_exactly(store: JsonlSessionStore) -> None:
    """A window of several ranges (old messages dropped) rebuilds exactly those messages."""
    history = [user("m0"), assistant("m1"), user("m2"), assistant("m3"), user("m4")]
    writer = await new_writer(store)
    await add(writer, *history)
    request = call_request(PROMPT_A, ((0, 1), (3, 5)))
    await persist_call(writer, request)
    await writer.aclose()
    replay = replay_file(writer.path)
    turn = call_numbered(replay, 0)
    assert (turn.window, replay.sent(turn)) == (((0, 1), (3, 5)), [history[0], *history[3:]])
    live = request_body("anthropic", PROMPT_A.text, [history[0], *history[3:]], TOOLS_A,
                        "claude-test", {"max_tokens": 256})
    assert replay.request(turn) == live


async def test_injected_messages_appear_at_their_positions(store: JsonlSessionStore) -> None:
    """Injected summary messages are put back at their recorded positions in the sent list."""
    history = [user("m0"), assistant("m1"), user("m2"), assistant("m3")]
    summary, note = user("[summary of m0-m1]"), user("[note]")
    writer = await new_writer(store)
    await add(writer, *history)
    await persist_call(writer, call_request(
        PROMPT_A, ((2, 4),), injected=(Injected(0, summary), Injected(2, note)),
    ))
    await writer.aclose()
    replay = replay_file(writer.path)
    turn = call_numbered(replay, 0)
    assert replay.sent(turn) == [summary, history[2], note, history[3]]
    assert turn.injected == (Injected(0, summary), Injected(2, note))
    assert len(replay.messages) == 4


async def test_failed_call_is_a_turn_without_assistant(store: JsonlSessionStore) -> None:
    """A call whose outcome is an error (no assistant) is its own turn; the retry is the next."""
    writer = await new_writer(store)
    await add(writer, U1)
    await persist_call(writer, call_request(PROMPT_A, ((0, 1),)))
    await record_outcome(writer, Outcome(call=0, error={"kind": "timeout"}))
    await persist_call(writer, call_request(PROMPT_A, ((0, 1),)))
    await add(writer, A1)
    await record_outcome(writer, Outcome(call=1, stop_reason="end_turn"))
    await persist_call(writer, call_request(PROMPT_A, ((0, 2),)))
    await record_outcome(writer, Outcome(call=2, error={"kind": "http_500"}))
    await writer.aclose()

    replay = replay_file(writer.path)
    rows = []
    for t in replay.calls:
        outcome = replay.outcome_of(t)
        rows.append((t.index, t.entry_number, t.assistant, outcome.error if outcome else None))
    assert rows == [
        (1, 0, None, {"kind": "timeout"}), (2, 1, 1, None), (3, 2, None, {"kind": "http_500"}),
    ]
    assert [len(replay.sent(t)) for t in replay.calls] == [1, 1, 2]
    assert call_json(replay, replay.calls[0])["assistant"] is None


async def test_assistant_without_call_entry_is_unrecorded_turn(store: JsonlSessionStore) -> None:
    """An assistant message with no call before it (persist failed) is a turn with a notice."""
    writer = await new_writer(store)
    await add(writer, U1)
    await persist_call(writer, call_request(PROMPT_A, ((0, 1),)))
    await add(writer, A1, U2, A2)
    await writer.aclose()
    replay = replay_file(writer.path)
    assert [(t.index, t.entry_number, t.prompt is not None, t.prompt_notice, t.window, t.assistant)
            for t in replay.calls] == [
        (1, 0, True, None, ((0, 1),), 1),
        (2, None, False, NOTICE_CALL_UNRECORDED, None, 3),
    ]
    second = call_json(replay, replay.calls[1])
    assert (second["systemPrompt"], second["messages"], second["promptNotice"]) == (
        None, None, NOTICE_CALL_UNRECORDED,
    )


async def test_call_naming_an_unknown_prompt_has_a_notice(store: JsonlSessionStore) -> None:
    """A call entry whose prompt fingerprint has no prompt entry gets a null prompt and notice."""
    writer = await new_writer(store)
    await add(writer, U1)
    await writer.append([entries.call(0, call_request(PROMPT_A, ((0, 1),), tools=()), None)])
    await writer.aclose()
    replay = replay_file(writer.path)
    (turn,) = replay.calls
    assert (turn.prompt, turn.prompt_notice, replay.problems) == (None, NOTICE_PROMPT_MISSING, ())


async def test_prompt_with_a_joiner_field_uses_it(store: JsonlSessionStore) -> None:
    """A prompt entry with a ``joiner`` joins its sections with it instead of a blank line."""
    text = f"{SOUL}\n{MOOD}"
    writer = await new_writer(store)
    await writer.append([
        entries.section(sha16(SOUL), SOUL),
        entries.section(sha16(MOOD), MOOD),
        {**entries.prompt(sha16(text), "initial", [("soul", sha16(SOUL)), ("mood", sha16(MOOD))]),
         "joiner": "\n"},
    ])
    await writer.aclose()
    (version,) = replay_file(writer.path).prompts
    assert (version.text, version.verified) == (text, True)


# -- problems and robustness ---------------------------------------------------------------------


async def test_seq_duplicate_reported_with_line_number(store: JsonlSessionStore) -> None:
    """A line repeated (same seq twice) is reported on the repeated line."""
    path = await basic_session(store)
    line_11 = path.read_bytes().splitlines()[10]
    edit_lines(path, {}, insert_after=11, extra=line_11)
    assert replay_file(path).problems == (
        Problem(12, "seq 10: duplicate or out-of-order (previous 10)"),
    )


async def test_seq_gap_reported_with_line_number(store: JsonlSessionStore) -> None:
    """A missing line (seq jumps) is reported on the line after the gap."""
    path = await basic_session(store)
    edit_lines(path, {10: None})
    replay = replay_file(path)
    assert replay.problems == (Problem(10, "seq 10: gap before (previous 8)"),)
    assert replay.outcome_of(replay.calls[0]) is None


async def test_corrupt_middle_line_reported_and_later_turns_replay(
    store: JsonlSessionStore,
) -> None:
    """A corrupt line mid-file is a problem with its line number; later turns still replay."""
    path = await basic_session(store)
    edit_lines(path, {10: b'{"type":"outcome","call":0,"stop_re'})
    replay = replay_file(path)
    assert replay.problems == (
        Problem(10, "not valid JSON"), Problem(11, "seq 10: gap before (previous 8)"),
    )
    assert [replay.sent(t) for t in replay.calls] == [[U1], [U1, A1, U2]]
    assert [t.prompt.verified if t.prompt else None for t in replay.calls] == [True, True]
    assert replay.torn_tail is False


async def test_non_object_line_and_second_header_are_problems(store: JsonlSessionStore) -> None:
    """A JSON line that is not an object, and a second session header, are reported."""
    path = await basic_session(store)
    header = path.read_bytes().splitlines()[0]
    edit_lines(path, {10: b"[1, 2]", 14: header})
    assert replay_file(path).problems == (
        Problem(10, "not a JSON object"),
        Problem(11, "seq 10: gap before (previous 8)"),
        Problem(14, "seq 0: duplicate or out-of-order (previous 12)"),
        Problem(14, "a second session header"),
    )


async def test_tampered_section_text_fails_verification(store: JsonlSessionStore) -> None:
    """A section whose text was edited no longer matches its hash: two problems, unverified."""
    path = await basic_session(store)
    line_4 = path.read_bytes().splitlines()[3]
    assert orjson.loads(line_4)["text"] == MEMORY_1
    edit_lines(path, {4: line_4.replace(b"likes tea", b"likes rum")})
    replay = replay_file(path)
    assert replay.problems == (
        Problem(4, f"section {sha16(MEMORY_1)} text does not match its hash"),
        Problem(6, f"rebuilt prompt does not match fingerprint {PROMPT_A.fingerprint}"),
    )
    (version,) = replay.prompts
    assert version.verified is False
    assert version.text == PROMPT_A.text.replace("likes tea", "likes rum")


async def test_missing_section_leaves_prompt_text_unknown(store: JsonlSessionStore) -> None:
    """A prompt naming a section that is not in the log has no text and is not verified."""
    path = await basic_session(store)
    edit_lines(path, {4: None})
    replay = replay_file(path)
    assert replay.problems == (
        Problem(4, "seq 4: gap before (previous 2)"),
        Problem(5, f"prompt names section {sha16(MEMORY_1)} not found before it"),
    )
    (version,) = replay.prompts
    assert (version.text, version.verified) == (None, False)
    assert [s.text for s in version.sections] == [SOUL, None, MOOD]


async def test_malformed_window_reported(store: JsonlSessionStore) -> None:
    """A call window reaching past the messages written so far is a problem; window unknown."""
    writer = await new_writer(store)
    await add(writer, U1)
    await persist_call(writer, call_request(PROMPT_A, ((0, 5),)))
    await writer.aclose()
    replay = replay_file(writer.path)
    assert replay.problems == (Problem(8, "call entry has a malformed window"),)
    assert (replay.calls[0].window, replay.sent(replay.calls[0])) == (None, [])


async def test_window_bounds_must_be_integers_not_booleans(store: JsonlSessionStore) -> None:
    """A window written as JSON booleans or floats is malformed, never read as 0/1."""
    writer = await new_writer(store)
    await add(writer, U1)
    for window in ([[False, True]], [[0, 1.0]], [[0]], [0, 1], "0-1"):
        body = entries.call(0, call_request(PROMPT_A, (), tools=()), None)
        await writer.append([{**body, "window": window}])
    await writer.aclose()
    replay = replay_file(writer.path)
    assert [t.window for t in replay.calls] == [None] * 5
    assert [p.message for p in replay.problems] == ["call entry has a malformed window"] * 5


async def test_torn_tail_skipped_without_problem(store: JsonlSessionStore) -> None:
    """An unfinished last line is skipped and flagged, not reported as corruption."""
    path = await basic_session(store)
    with path.open("ab") as fh:
        fh.write(b'{"type":"message","seq":14,"ts":"2026-')
    replay = replay_file(path)
    assert (replay.torn_tail, replay.problems, len(replay.calls)) == (True, (), 2)


async def test_unknown_entry_types_are_skipped(store: JsonlSessionStore) -> None:
    """Entry types this reader does not know (newer writers) are ignored silently."""
    writer = await new_writer(store)
    await add(writer, U1)
    await writer.append([{"type": "reflection", "summary": "likes tea"}])
    await persist_call(writer, call_request(PROMPT_A, ((0, 1),)))
    await writer.append([{"type": "future_thing", "payload": [1, 2, 3]}])
    await add(writer, A1)
    await writer.aclose()
    replay = replay_file(writer.path)
    assert (replay.problems, [replay.sent(t) for t in replay.calls]) == ((), [[U1]])


@pytest.mark.parametrize("data", [b"", b"\n\n", b"   \n", b'{"type":"session","version":3'])
def test_empty_or_torn_header_raises_empty_session(data: bytes) -> None:
    """No bytes, blank lines or only a torn header raise EmptySessionError."""
    with pytest.raises(EmptySessionError):
        replay_bytes(data)


@pytest.mark.parametrize(
    "data",
    [
        b"garbage\n",
        b'{"type":"message","message":{"role":"user","content":"x"}}\n',
        b"[1]\n",
        b'{"type":"session","version":"3"}\n',
        b'{"type":"session","version":0}\n',
        b'{"type":"session","version":true}\n',
    ],
)
def test_bad_header_raises_corrupt_header(data: bytes) -> None:
    """A first line that is not a session header with a valid version is CorruptHeaderError."""
    with pytest.raises(CorruptHeaderError) as info:
        replay_bytes(data)
    assert isinstance(info.value, SessionReadError)
    assert info.value.line == 1


async def test_replay_json_is_linear_and_complete(store: JsonlSessionStore) -> None:
    """The whole-replay JSON lists each message and section once; turns point at them."""
    replay = replay_file(await basic_session(store))
    doc = replay_json(replay)
    assert list(doc) == [
        "session", "version", "notice", "tornTail", "problems", "gaps", "refusals", "replies",
        "deliveries", "messages",
        "sections",
        "prompts", "toolSets", "calls",
    ]
    assert [m["message"] for m in doc["messages"]] == [U1, A1, U2, A2]
    assert doc["sections"] == {sha16(SOUL): SOUL, sha16(MEMORY_1): MEMORY_1, sha16(MOOD): MOOD}
    assert [(t["index"], t["prompt"], t["window"], t["assistant"], t["call"])
            for t in doc["calls"]] == [(1, 1, [[0, 1]], 1, 0), (2, 1, [[0, 3]], 3, 1)]
    assert list(doc["toolSets"].values()) == [list(TOOLS_A)]
    assert orjson.loads(orjson.dumps(doc)) == doc


@pytest.mark.parametrize("key", ["call", "turn"])
def test_rerun_header_names_its_call_under_either_key(key: str) -> None:
    """A rerun log's ``rerunOf`` names the call it reruns as ``call``, or as ``turn`` in rerun
    logs saved before calls were called calls: both read as the same call."""
    header = {"type": "session", "seq": 0, "version": 3, "id": "r1",
              "rerunOf": {"session": "s1", "tenant": "t1", key: 3, "promptFingerprint": "x"}}
    replay = replay_bytes(orjson.dumps(header) + b"\n")
    assert replay.rerun_of is not None
    assert (replay.rerun_of.session, replay.rerun_of.tenant, replay.rerun_of.call) == (
        "s1", "t1", 3)
    assert replay_bytes(orjson.dumps({**header, "rerunOf": None}) + b"\n").rerun_of is None
