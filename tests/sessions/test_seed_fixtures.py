"""Replay of the seed project's v1/v2 logs, as the fixtures' README says it must read them."""

from __future__ import annotations

import pytest

from sessions.errors import EmptySessionError
from sessions.replay import (
    NOTICE_BEFORE_FIRST,
    NOTICE_NO_PROMPTS,
    NOTICE_V1,
    NotRebuildableError,
    Replay,
    replay_bytes,
)
from tests.sessions.helpers import SEED_DIR, sha16


def seed(name: str) -> Replay:
    return replay_bytes((SEED_DIR / name).read_bytes())


def prompt_numbers(replay: Replay) -> list[int | None]:
    return [t.prompt.number if t.prompt else None for t in replay.calls]


def test_v1_two_turns_no_prompt_recorded() -> None:
    """v1: two turns, every prompt null, and the notice says it predates prompt recording."""
    replay = seed("v1-messages-only.jsonl")
    assert (replay.version, len(replay.calls), replay.prompts_recorded) == (1, 2, False)
    assert replay.notice == NOTICE_V1 == "system prompt not recorded (predates prompt recording)"
    assert [(t.prompt, t.prompt_notice) for t in replay.calls] == [(None, NOTICE_V1)] * 2
    assert [len(replay.sent(t)) for t in replay.calls] == [1, 3]
    assert replay.problems == ()


def test_v2_prompt_timeline() -> None:
    """v2 timeline: turn 1 initial, turns 2-3 first rebuilt, last prompt unused, extras ignored."""
    replay = seed("v2-prompt-timeline.jsonl")
    assert (len(replay.calls), replay.prompts_recorded, replay.notice) == (3, True, None)
    assert [(v.number, v.reason, v.first_call, v.verified) for v in replay.prompts] == [
        (1, "initial", 1, True), (2, "rebuilt", 2, True), (3, "rebuilt", None, True),
    ]
    assert prompt_numbers(replay) == [1, 2, 2]
    assert [len(replay.sent(t)) for t in replay.calls] == [1, 3, 5]
    first = replay.calls[0]
    assert first.assistant is not None
    assert replay.messages[first.assistant]["content"][0]["type"] == "tool_use"
    assert [v.fingerprint for v in replay.prompts] == [
        sha16(v.text or "") for v in replay.prompts
    ]
    assert replay.problems == ()  # reflection and model_change are skipped, not problems
    assert replay.calls[2].model is None  # model_change is not applied to turns


def test_v2_without_prompts_says_persistence_likely_failed() -> None:
    """v2 with no prompt entry: one turn with a null prompt and the 'likely failed' notice."""
    replay = seed("v2-no-prompts.jsonl")
    assert (len(replay.calls), replay.prompts_recorded) == (1, False)
    assert replay.notice == NOTICE_NO_PROMPTS
    assert NOTICE_NO_PROMPTS == "no prompt entry in this session: prompt persistence likely failed"
    assert [(t.prompt, t.prompt_notice) for t in replay.calls] == [(None, NOTICE_NO_PROMPTS)]


def test_v2_late_prompt_is_not_back_filled_and_torn_tail_skipped() -> None:
    """v2 late prompt: turn 1 keeps a null prompt, turn 2 has it, the torn tail is skipped."""
    replay = seed("v2-late-prompt-torn-tail.jsonl")
    assert (len(replay.calls), replay.prompts_recorded, replay.notice) == (2, True, None)
    assert prompt_numbers(replay) == [None, 1]
    assert [t.prompt_notice for t in replay.calls] == [NOTICE_BEFORE_FIRST, None]
    assert (replay.torn_tail, replay.problems) == (True, ())
    assert len(replay.messages) == 4
    assert replay.prompts[0].text == "You are Lisa, v2."
    assert replay.prompts[0].first_call == 2


def test_empty_file_is_a_clear_error() -> None:
    """An empty log raises EmptySessionError rather than replaying as nothing."""
    with pytest.raises(EmptySessionError, match="empty"):
        seed("empty.jsonl")


@pytest.mark.parametrize(
    ("name", "turns"),
    [
        ("v1-messages-only.jsonl", 2),
        ("v2-prompt-timeline.jsonl", 3),
        ("v2-no-prompts.jsonl", 1),
        ("v2-late-prompt-torn-tail.jsonl", 2),
    ],
)
def test_seed_calls_are_not_offered_as_rebuilt_requests(name: str, turns: int) -> None:
    """Seed logs predate call entries: every turn says its call was not recorded, and no
    request body is offered for it (its prompt and messages still read)."""
    replay = seed(name)
    assert len(replay.calls) == turns
    version = replay.version
    for turn in replay.calls:
        assert turn.status_text == f"not recorded (format v{version} predates call recording)"
        assert replay.sent(turn)
        for shape in ("anthropic", "openai"):
            with pytest.raises(NotRebuildableError, match="predates call recording"):
                replay.request(turn, shape)
