"""The fakes' prompt cache counts cached prefixes as the real APIs document it."""

from __future__ import annotations

from typing import Any

import anthropic
import orjson
import pytest

from tests.fakes.prompt_cache import PromptCache, TooManyBreakpoints
from tests.fakes.providers import FakeProviderServer

MARK = {"type": "ephemeral"}
STABLE = "s" * 8000  # about 2000 tokens at the fakes' 4 bytes a token


def text(value: str, marked: bool = False) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": value}
    if marked:
        block["cache_control"] = MARK
    return block


def conversation(turns: int, *, model: str = "claude-x", mark_last: bool = True,
                 system: str = STABLE) -> dict[str, Any]:
    """A body with a marked stable system block and ``turns`` user/assistant pairs plus a
    final user message (marked at the end when ``mark_last``)."""
    messages: list[dict[str, Any]] = []
    for i in range(turns):
        messages.append({"role": "user", "content": [text(f"question {i}")]})
        messages.append({"role": "assistant", "content": [text(f"answer {i}")]})
    messages.append({"role": "user", "content": [text("latest", marked=mark_last)]})
    return {"model": model, "max_tokens": 10, "system": [text(system, marked=True)],
            "messages": messages}


def count(cache: PromptCache, body: dict[str, Any]) -> tuple[int, int, int]:
    usage = cache.anthropic(body, orjson.dumps(body))
    return usage.input_tokens, usage.cache_read, usage.cache_write


def test_first_call_writes_second_reads() -> None:
    """A repeated request reads what the first wrote; the three counts add up to the prompt."""
    cache = PromptCache()
    body = conversation(2)
    whole = len(orjson.dumps(body)) // 4
    first = count(cache, body)
    second = count(cache, body)
    assert first[1] == 0
    assert first[2] > 2000
    assert second == (first[0], first[2], 0)
    assert sum(first) == sum(second) == whole


def grown(turns: int) -> dict[str, Any]:
    """A conversation after ``turns`` answered questions, ending with question ``turns``
    (marked): each call repeats the previous one and adds an answer and a question."""
    messages: list[dict[str, Any]] = []
    for i in range(turns):
        messages.append({"role": "user", "content": [text(f"question {i}")]})
        messages.append({"role": "assistant", "content": [text(f"answer {i}")]})
    messages.append({"role": "user", "content": [text(f"question {turns}", marked=True)]})
    return {"model": "claude-x", "max_tokens": 10, "system": [text(STABLE, marked=True)],
            "messages": messages}


def test_moved_history_marker_reads_the_previous_prefix() -> None:
    """The next call's marker sits two blocks later; the look-back finds the previous call's
    whole prefix, and only the two new blocks are written."""
    cache = PromptCache()
    _, read0, write0 = count(cache, grown(1))
    _, read1, write1 = count(cache, grown(2))
    assert read0 == 0
    assert read1 == write0
    new_blocks = [{"type": "text", "text": "answer 1"}, {"type": "text", "text": "question 2"}]
    assert write1 == sum(len(f"{n}:{r}:".encode() + orjson.dumps(b, option=orjson.OPT_SORT_KEYS))
                         // 4 for n, r, b in ((3, "assistant", new_blocks[0]),
                                              (4, "user", new_blocks[1])))


def test_changed_history_reads_only_the_system_prefix() -> None:
    """When an earlier message differs, only the system breakpoint's prefix is read."""
    cache = PromptCache()
    count(cache, conversation(1))
    system_only = count(PromptCache(), conversation(0, mark_last=False))[2]
    _, read, _ = count(cache, conversation(2))  # "latest" became "question 1" at its place
    assert read == system_only


def test_look_back_is_twenty_blocks() -> None:
    """More than 20 new blocks after the last cached breakpoint: only the system prefix hits."""
    cache = PromptCache()
    count(cache, conversation(0))
    system_only = count(cache, conversation(0, mark_last=False))[1]
    _, read, _ = count(cache, conversation(11))  # 22 new blocks before the marker
    assert read == system_only


def test_short_prefix_is_not_cached() -> None:
    """Below the minimum cacheable length nothing is written or read."""
    cache = PromptCache()
    body = conversation(1, system="short")
    assert count(cache, body)[1:] == (0, 0)
    assert count(cache, body)[1:] == (0, 0)


def test_cache_is_per_model() -> None:
    """The same prefix for another model is a miss."""
    cache = PromptCache()
    count(cache, conversation(1))
    assert count(cache, conversation(1, model="claude-y"))[1] == 0


def test_moving_a_marker_keeps_the_prefix_identity() -> None:
    """Prefixes are identified without their markers: an unmarked copy still matches."""
    cache = PromptCache()
    count(cache, conversation(1))
    body = conversation(1)
    body["messages"][-1]["content"][0].pop("cache_control")
    body["messages"].append({"role": "assistant", "content": [text("more", marked=True)]})
    assert count(cache, body)[1] > 2000


def test_more_than_four_breakpoints_is_refused() -> None:
    """Five marked blocks raise, as the API answers 400."""
    body = conversation(2)
    for message in body["messages"]:
        message["content"][0]["cache_control"] = MARK
    with pytest.raises(TooManyBreakpoints, match="Found 6"):
        PromptCache.check(body)


def test_openai_reads_whole_message_prefixes_in_128_token_steps() -> None:
    """A long prompt sent again reads its cached prefix in 128-token steps; short ones never."""
    cache = PromptCache()
    messages = [{"role": "system", "content": STABLE}, {"role": "user", "content": "a"}]
    body = {"model": "gpt-x", "messages": messages}
    assert cache.openai(body, orjson.dumps(body)) == 0
    longer = {"model": "gpt-x", "messages": [*messages, {"role": "user", "content": "b"}]}
    cached = cache.openai(longer, orjson.dumps(longer))
    assert cached >= 1024
    assert cached % 128 == 0
    short = {"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}
    assert cache.openai(short, orjson.dumps(short)) == 0
    assert cache.openai(short, orjson.dumps(short)) == 0


async def test_server_answers_400_for_too_many_breakpoints() -> None:
    """Through the SDK: five breakpoints get the API's 400, and nothing is cached."""
    body = conversation(2)
    for message in body["messages"]:
        message["content"][0]["cache_control"] = MARK
    async with FakeProviderServer() as srv:
        client = anthropic.AsyncAnthropic(api_key="k", base_url=srv.anthropic_base_url,
                                          max_retries=0)
        with pytest.raises(anthropic.BadRequestError, match="maximum of 4 blocks"):
            await client.post("/v1/messages", body=body, cast_to=object)
        reply: Any = await client.post("/v1/messages", body=conversation(1), cast_to=object)
        again: Any = await client.post("/v1/messages", body=conversation(1), cast_to=object)
        await client.close()
    assert reply["usage"]["cache_read_input_tokens"] == 0
    assert reply["usage"]["cache_creation_input_tokens"] > 2000
    assert again["usage"]["cache_read_input_tokens"] == reply["usage"][
        "cache_creation_input_tokens"]
