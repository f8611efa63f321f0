"""Prompt persistence: what persist_call writes, and what it does not write again."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from sessions.jsonl import JsonlSessionStore
from sessions.persist import PersistReport, persist_call, record_outcome
from sessions.records import Injected, Outcome
from sessions.replay import replay_bytes
from sessions.shapes import encode_body
from tests.sessions.helpers import (
    MEMORY_1,
    MEMORY_2,
    MOOD,
    PROMPT_A,
    PROMPT_B,
    SOUL,
    TOOLS_A,
    TOOLS_B,
    add,
    assistant,
    call_request,
    log_entries,
    log_types,
    make_prompt,
    of_type,
    sha16,
    user,
    without_times,
)

ISO_MS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


@pytest.fixture
def store(tmp_path: Path) -> JsonlSessionStore:
    return JsonlSessionStore(tmp_path / "data", durability="none")


async def test_new_session_header_declares_version_3(store: JsonlSessionStore) -> None:
    """A new session's first line is a v3 header naming channel, conversation and tenant, and
    its generation (the conversation's first session: 1)."""
    writer = await store.create(
        tenant="acme", channel="telegram", conversation="chat-42", session_id="s1"
    )
    await writer.aclose()
    (head,) = log_entries(writer.path)
    assert without_times(head) == {
        "type": "session",
        "seq": 0,
        "version": 3,
        "id": "s1",
        "channel": "telegram",
        "conversation": "chat-42",
        "tenant": "acme",
        "generation": 1,
    }
    assert ISO_MS.fullmatch(head["ts"])
    assert ISO_MS.fullmatch(head["startedAt"])


async def test_generated_session_id_is_sortable_and_valid(store: JsonlSessionStore) -> None:
    """create() without an id makes a UTC-time-prefixed id and names the file after it."""
    writer = await store.create(channel="console", conversation="c")
    await writer.aclose()
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{12}", writer.session_id)
    assert writer.path.name == f"{writer.session_id}.jsonl"


async def test_first_prompt_written_with_its_fingerprint(store: JsonlSessionStore) -> None:
    """The first call writes each section, the prompt (sha256[:16] of the joined text), tools."""
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    await add(writer, user("hello"))
    await writer.flush()
    size_before = writer.path.stat().st_size
    report = await persist_call(writer, call_request(PROMPT_A, ((0, 1),)))
    await writer.aclose()

    expected_text = f"{SOUL}\n\n{MEMORY_1}\n\n{MOOD}"
    assert PROMPT_A.text == expected_text
    assert log_types(writer.path) == [
        "session", "message", "section", "section", "section", "prompt", "tools", "call",
    ]
    assert [(s["hash"], s["text"]) for s in of_type(writer.path, "section")] == [
        (sha16(SOUL), SOUL), (sha16(MEMORY_1), MEMORY_1), (sha16(MOOD), MOOD),
    ]
    (prompt,) = of_type(writer.path, "prompt")
    assert without_times(prompt, ("ts", "seq")) == {
        "type": "prompt",
        "fingerprint": sha16(expected_text),
        "reason": "initial",
        "sections": [
            {"name": "soul", "hash": sha16(SOUL)},
            {"name": "memory", "hash": sha16(MEMORY_1)},
            {"name": "mood", "hash": sha16(MOOD)},
        ],
    }
    (call,) = of_type(writer.path, "call")
    assert without_times(call, ("ts", "seq")) == {
        "type": "call",
        "call": 0,
        "prompt": sha16(expected_text),
        "tools": of_type(writer.path, "tools")[0]["fingerprint"],
        "provider": "anthropic",
        "model": "claude-test",
        "params": {"max_tokens": 256},
        "window": [[0, 1]],
    }
    assert report == PersistReport(
        call=0, sections_written=3, prompt_written=True, tools_written=True,
        bytes_written=writer.path.stat().st_size - size_before,
    )


async def test_entries_carry_consecutive_seq_and_ms_timestamps(store: JsonlSessionStore) -> None:
    """Every line has seq 0, 1, 2, ... in file order and an ISO-8601 UTC millisecond ts."""
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    await add(writer, user("hello"))
    await persist_call(writer, call_request(PROMPT_A, ((0, 1),)))
    await add(writer, assistant("hi"))
    await record_outcome(writer, Outcome(call=0, stop_reason="end_turn"))
    await writer.aclose()
    lines = log_entries(writer.path)
    assert [e["seq"] for e in lines] == list(range(len(lines)))
    assert all(ISO_MS.fullmatch(e["ts"]) for e in lines)
    assert [list(e)[:3] for e in lines] == [["type", "seq", "ts"]] * len(lines)


async def test_unchanged_prompt_writes_only_a_call_entry(store: JsonlSessionStore) -> None:
    """A second call with the same prompt and tools appends exactly one call entry."""
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    await add(writer, user("hello"))
    await persist_call(writer, call_request(PROMPT_A, ((0, 1),)))
    await add(writer, assistant("hi"), user("again"))
    await writer.flush()
    before = log_types(writer.path)
    report = await persist_call(writer, call_request(PROMPT_A, ((0, 3),)))
    await writer.aclose()
    assert log_types(writer.path) == [*before, "call"]
    assert report.sections_written == 0
    assert (report.prompt_written, report.tools_written) == (False, False)
    assert [c["call"] for c in of_type(writer.path, "call")] == [0, 1]
    assert report.bytes_written == len(writer.path.read_bytes().splitlines(keepends=True)[-1])


async def test_a_b_a_writes_three_prompts_but_each_section_once(store: JsonlSessionStore) -> None:
    """Switching A -> B -> A writes three prompt entries while every section text appears once."""
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    await add(writer, user("hello"))
    await persist_call(writer, call_request(PROMPT_A, ((0, 1),)))
    await persist_call(writer, call_request(PROMPT_B, ((0, 1),), reason="rebuilt"))
    third = await persist_call(writer, call_request(PROMPT_A, ((0, 1),), reason="rebuilt"))
    await writer.aclose()

    assert [(p["fingerprint"], p["reason"]) for p in of_type(writer.path, "prompt")] == [
        (PROMPT_A.fingerprint, "initial"),
        (PROMPT_B.fingerprint, "rebuilt"),
        (PROMPT_A.fingerprint, "rebuilt"),
    ]
    assert [s["text"] for s in of_type(writer.path, "section")] == [SOUL, MEMORY_1, MOOD, MEMORY_2]
    assert (third.prompt_written, third.sections_written) == (True, 0)


async def test_one_section_change_writes_only_that_section(store: JsonlSessionStore) -> None:
    """Changing one section writes that section's text, a prompt entry and the call: no more."""
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    await add(writer, user("hello"))
    await persist_call(writer, call_request(PROMPT_A, ((0, 1),)))
    await writer.flush()
    before = log_types(writer.path)
    report = await persist_call(writer, call_request(PROMPT_B, ((0, 1),), reason="rebuilt"))
    await writer.aclose()
    assert log_types(writer.path) == [*before, "section", "prompt", "call"]
    assert of_type(writer.path, "section")[-1]["text"] == MEMORY_2
    assert of_type(writer.path, "prompt")[-1]["sections"] == [
        {"name": "soul", "hash": sha16(SOUL)},
        {"name": "memory", "hash": sha16(MEMORY_2)},
        {"name": "mood", "hash": sha16(MOOD)},
    ]
    assert (report.sections_written, report.prompt_written, report.tools_written) == (
        1, True, False,
    )


async def test_identical_section_texts_in_one_prompt_written_once(
    store: JsonlSessionStore,
) -> None:
    """Two sections with the same text are one section entry referenced twice."""
    twice = make_prompt(("a", SOUL), ("b", SOUL))
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    await persist_call(writer, call_request(twice, ()))
    await writer.aclose()
    assert [s["text"] for s in of_type(writer.path, "section")] == [SOUL]
    assert of_type(writer.path, "prompt")[0]["sections"] == [
        {"name": "a", "hash": sha16(SOUL)},
        {"name": "b", "hash": sha16(SOUL)},
    ]


async def test_resume_does_not_rewrite_what_the_log_holds(store: JsonlSessionStore) -> None:
    """After close + open, the prompt in effect, known sections and tools are not rewritten."""
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    await add(writer, user("hello"))
    await persist_call(writer, call_request(PROMPT_A, ((0, 1),), tools=TOOLS_A))
    await persist_call(writer, call_request(PROMPT_B, ((0, 1),), tools=TOOLS_B))
    await add(writer, assistant("hi"))
    await writer.aclose()
    before = log_types(writer.path)

    resumed = await store.open("default", "s1")
    state = resumed.state
    assert (state.next_seq, state.message_count, state.call_count) == (len(before), 2, 2)
    assert state.last_prompt == PROMPT_B.fingerprint
    await add(resumed, user("still there?"))
    same = await persist_call(resumed, call_request(PROMPT_B, ((0, 3),), tools=TOOLS_B))
    back = await persist_call(resumed, call_request(PROMPT_A, ((0, 3),), tools=TOOLS_A))
    await resumed.aclose()

    assert log_types(writer.path) == [*before, "message", "call", "prompt", "call"]
    assert (same.call, same.prompt_written, same.sections_written, same.tools_written) == (
        2, False, 0, False,
    )
    assert (back.call, back.prompt_written, back.sections_written, back.tools_written) == (
        3, True, 0, False,
    )
    lines = log_entries(writer.path)
    assert [e["seq"] for e in lines] == list(range(len(lines)))


async def test_resume_writes_a_real_change(store: JsonlSessionStore) -> None:
    """After resume a new section text and a new tool set are written (once)."""
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    await persist_call(writer, call_request(PROMPT_A, (), tools=TOOLS_A))
    await writer.aclose()
    before = log_types(writer.path)

    resumed = await store.open("default", "s1")
    report = await persist_call(resumed, call_request(PROMPT_B, (), tools=TOOLS_B))
    await resumed.aclose()
    assert log_types(writer.path) == [*before, "section", "prompt", "tools", "call"]
    assert (report.sections_written, report.prompt_written, report.tools_written) == (1, True, True)


async def test_tools_written_once_per_distinct_set(store: JsonlSessionStore) -> None:
    """Tool sets A, A, B, A(equal copy), none: two tools entries; calls name each set or null."""
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    reports = [
        await persist_call(writer, call_request(PROMPT_A, (), tools=tools))
        for tools in (TOOLS_A, TOOLS_A, TOOLS_B, (dict(TOOLS_A[0]),), ())
    ]
    await writer.aclose()
    tool_entries = of_type(writer.path, "tools")
    assert [t["tools"] for t in tool_entries] == [list(TOOLS_A), list(TOOLS_B)]
    fp_a, fp_b = (t["fingerprint"] for t in tool_entries)
    assert [c["tools"] for c in of_type(writer.path, "call")] == [fp_a, fp_a, fp_b, fp_a, None]
    assert [r.tools_written for r in reports] == [True, False, True, False, False]


async def test_tools_fingerprint_is_sorted_compact_json(store: JsonlSessionStore) -> None:
    """A tool set's fingerprint is sha256[:16] of its key-sorted compact JSON list."""
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    await persist_call(writer, call_request(PROMPT_A, (), tools=TOOLS_A))
    await writer.aclose()
    (entry,) = of_type(writer.path, "tools")
    canonical = (
        '[{"description":"Current time in a time zone","input_schema":{"properties":'
        '{"tz":{"type":"string"}},"type":"object"},"name":"get_time"}]'
    )
    assert entry["fingerprint"] == sha16(canonical)


async def test_outcome_entry_records_result(store: JsonlSessionStore) -> None:
    """record_outcome writes call index, stop reason, usage, latency and error when given."""
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    await record_outcome(writer, Outcome(call=0, stop_reason="end_turn",
                                         usage={"input_tokens": 12}, latency_ms=8.12345))
    await record_outcome(writer, Outcome(call=1, error={"kind": "timeout"}))
    await writer.aclose()
    assert [without_times(o, ("ts", "seq")) for o in of_type(writer.path, "outcome")] == [
        {"type": "outcome", "call": 0, "stop_reason": "end_turn",
         "usage": {"input_tokens": 12}, "latency_ms": 8.123},
        {"type": "outcome", "call": 1, "error": {"kind": "timeout"}},
    ]


async def test_injected_messages_recorded_in_call(store: JsonlSessionStore) -> None:
    """Injected messages are stored in the call entry with their positions, not as messages."""
    summary = user("[summary] earlier we talked about tea")
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    await add(writer, user("a"), assistant("b"), user("c"))
    await persist_call(writer, call_request(PROMPT_A, ((2, 3),), injected=(Injected(0, summary),)))
    await writer.aclose()
    (call,) = of_type(writer.path, "call")
    assert call["window"] == [[2, 3]]
    assert call["injected"] == [{"position": 0, "message": summary}]
    assert len(of_type(writer.path, "message")) == 3


async def test_call_entry_records_the_endpoint_origin_only(store: JsonlSessionStore) -> None:
    """The endpoint rides beside the request as scheme://host:port: userinfo, path and query
    (where a proxy may carry a key) never reach the log, and the body rebuilds the same."""
    secret_url = "https://sk-user-SECRET:pw@proxy.example:8443/v1/?api_key=sk-query-SECRET#f"
    plain = call_request(PROMPT_A, ((0, 1),))
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    await add(writer, user("hi"))
    await persist_call(writer, replace(plain, endpoint=secret_url))
    await persist_call(writer, plain)
    await writer.aclose()
    data = writer.path.read_bytes()
    assert [call.get("endpoint") for call in of_type(writer.path, "call")] == [
        "https://proxy.example:8443", None]
    for leak in (b"SECRET", b"pw@", b"api_key", b"/v1", b"#f"):
        assert leak not in data
    replay = replay_bytes(data)
    with_endpoint, without = replay.calls
    assert (with_endpoint.endpoint, without.endpoint) == ("https://proxy.example:8443", None)
    assert encode_body(replay.request(with_endpoint)) == encode_body(replay.request(without))
