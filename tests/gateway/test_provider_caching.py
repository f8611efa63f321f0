"""The SDK providers post the recorded bytes, mark cache breakpoints, account cached tokens
and send OpenAI parameters as current models expect (real SDKs against the local fakes)."""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.edge.errors import ProviderError, ProviderUnavailable
from gateway.edge.provider import ProviderRequest
from providers.anthropic import AnthropicProvider
from providers.openai import OpenAIProvider, has_reasoning
from sessions.records import CachePlan, MessageDict
from sessions.shapes import encode_body, request_body
from tests.fakes.providers import FakeProviderServer, Reply
from tests.ports import refusing_port

STABLE = ("You are Nova. " * 400).strip()  # about 1,400 tokens at the fakes' 4 bytes a token
SECTIONS = (STABLE, "## Mood\ncalm")
SYSTEM = "\n\n".join(SECTIONS)
TOOL = {"name": "clock", "description": "time", "input_schema": {"type": "object"}}
PLAN = CachePlan(tools=True, system=1, history=True)


@pytest.fixture
async def srv() -> AsyncIterator[FakeProviderServer]:
    async with FakeProviderServer() as server:
        yield server


def grown(turns: int) -> list[MessageDict]:
    """A conversation after ``turns`` answered questions, ending with a new question."""
    messages: list[MessageDict] = []
    for i in range(turns):
        messages.append({"role": "user", "content": f"question {i}"})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"a{i}"}]})
    messages.append({"role": "user", "content": f"question {turns}"})
    return messages


async def test_anthropic_sends_the_planned_breakpoints_and_reads_the_cache(
    srv: FakeProviderServer,
) -> None:
    """Each call posts exactly the planned body; from the second on, the prefix is read."""
    provider = AnthropicProvider("k", "claude-x", base_url=srv.anthropic_base_url,
                                 max_retries=0)
    usages = []
    for turns in range(3):
        request = ProviderRequest(SYSTEM, grown(turns), [TOOL], "claude-x", provider.params(),
                                  sections=SECTIONS, cache=PLAN)
        usages.append(dict((await provider.complete(request)).usage))
        expected = request_body("anthropic", SYSTEM, grown(turns), [TOOL], "claude-x",
                                provider.params(), cache=PLAN, sections=SECTIONS)
        assert srv.requests[-1].raw == encode_body(expected)
    await provider.aclose()
    body = srv.requests[-1].body
    assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert [("cache_control" in b) for b in body["system"]] == [True, False]
    assert body["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert "cache_read_input_tokens" not in usages[0]
    assert usages[0]["cache_creation_input_tokens"] > 1000
    for before, after in itertools.pairwise(usages):
        # Everything the previous call cached is read; only the new turn is written.
        assert after["cache_read_input_tokens"] == (before.get("cache_read_input_tokens", 0)
                                                    + before["cache_creation_input_tokens"])
        assert 0 < after["cache_creation_input_tokens"] < 50


async def test_openai_cached_tokens_leave_input_tokens(srv: FakeProviderServer) -> None:
    """OpenAI's cached_tokens become cache_read_input_tokens; input_tokens excludes them."""
    provider = OpenAIProvider("k", "gpt-x", base_url=srv.openai_base_url, max_retries=0,
                              stream=False)
    first = await provider.complete(ProviderRequest(SYSTEM, grown(0), [], "gpt-x",
                                                    provider.params()))
    second = await provider.complete(ProviderRequest(SYSTEM, grown(1), [], "gpt-x",
                                                     provider.params()))
    await provider.aclose()
    whole = len(srv.requests[1].raw) // 4
    assert set(first.usage) == {"input_tokens", "output_tokens"}
    cached = second.usage["cache_read_input_tokens"]
    assert cached >= 1024
    assert second.usage["input_tokens"] == whole - cached


@pytest.mark.parametrize(
    ("model", "reasons"),
    [("o3", True), ("o4-mini", True), ("gpt-5", True), ("gpt-5-mini-2025-08-07", True),
     ("openai/gpt-5-nano", True), ("gpt-5-chat-latest", False), ("gpt-4o-mini", False),
     ("gpt-4.1", False), ("llama3.1", False)],
)
def test_which_models_reason(model: str, reasons: bool) -> None:
    """o-series and GPT-5 reason; GPT-5 chat, GPT-4 and other servers' models do not."""
    assert has_reasoning(model) is reasons


async def test_openai_params_for_a_reasoning_model(
    srv: FakeProviderServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A reasoning model gets max_completion_tokens and reasoning_effort, never temperature."""
    caplog.set_level(logging.WARNING, "providers.openai")
    provider = OpenAIProvider("k", "o4-mini", base_url=srv.openai_base_url, max_retries=0,
                              stream=False, temperature=0.3, reasoning_effort="low")
    assert provider.params() == {"max_completion_tokens": 1024, "reasoning_effort": "low"}
    await provider.complete(ProviderRequest("s", grown(0), [], "o4-mini", provider.params()))
    await provider.aclose()
    sent = srv.requests[0].body
    assert (sent["max_completion_tokens"], sent["reasoning_effort"]) == (1024, "low")
    assert "temperature" not in sent
    assert "max_tokens" not in sent
    assert [r.getMessage() for r in caplog.records] == [
        "model o4-mini refuses a temperature: it is not sent"]


async def test_openai_params_for_an_older_server(caplog: pytest.LogCaptureFixture) -> None:
    """max_tokens on request; a reasoning effort for a model without reasoning is not sent."""
    caplog.set_level(logging.WARNING, "providers.openai")
    provider = OpenAIProvider("k", "llama3.1", base_url="http://127.0.0.1:9/v1",
                              max_tokens=77, temperature=0.3, stream=False,
                              max_tokens_field="max_tokens", reasoning_effort="high")
    assert provider.params() == {"max_tokens": 77, "temperature": 0.3}
    assert [r.getMessage() for r in caplog.records] == [
        "model llama3.1 does not reason: reasoning_effort is not sent"]
    await provider.aclose()


@pytest.mark.parametrize("api", ["anthropic", "openai"])
async def test_big_integer_goes_out_exactly(srv: FakeProviderServer, api: str) -> None:
    """A tool input orjson cannot encode (an integer past 64 bits) is sent with all its digits,
    as the encoded body replay rebuilds."""
    provider = (AnthropicProvider("k", "m", base_url=srv.anthropic_base_url) if api == "anthropic"
                else OpenAIProvider("k", "m", base_url=srv.openai_base_url))
    call: MessageDict = {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "clock", "input": {"n": 2**70}}]}
    result: MessageDict = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}
    request = ProviderRequest("s", [*grown(0), call, result], [TOOL], "m", provider.params())
    await provider.complete(request)
    await provider.aclose()
    [received] = srv.requests
    assert received.raw == encode_body(request_body(api, "s", request.messages, [TOOL], "m",
                                                    provider.params()))
    assert str(2**70).encode() in received.raw


@pytest.mark.parametrize(
    ("api", "answer", "message"),
    [
        ("anthropic", {"id": "x"}, "has no content"),
        ("anthropic", {"content": ["text"]}, "not an object"),
        ("openai", {"choices": []}, "has no choices"),
        ("openai", {"choices": [{"index": 0}]}, "has no message"),
        ("anthropic", ["a", "list"], "not a JSON object"),
    ],
)
async def test_malformed_answer_is_a_provider_error(
    srv: FakeProviderServer, api: str, answer: Any, message: str
) -> None:
    """A 200 answer without the fields an answer has is a ProviderError, never a crash."""
    provider = (AnthropicProvider("k", "m", base_url=srv.anthropic_base_url, stream=False)
                if api == "anthropic"
                else OpenAIProvider("k", "m", base_url=srv.openai_base_url, stream=False))
    srv.script(api, Reply.error(200, body=answer) if isinstance(answer, dict)
               else Reply.error(200, body=b'["a", "list"]',
                                headers={"Content-Type": "application/json"}))
    with pytest.raises(ProviderError, match=message):
        await provider.complete(ProviderRequest("s", grown(0), [], "m", provider.params()))
    await provider.aclose()


@pytest.mark.parametrize("api", ["anthropic", "openai"])
async def test_refused_connection_is_unavailable_not_a_timeout(api: str) -> None:
    """Nothing listening: ProviderUnavailable at once, though the transport calls it a timeout."""
    with refusing_port() as port:  # held: a port let go could be answered by whoever took it
        base = f"http://127.0.0.1:{port}"
        provider = (AnthropicProvider("k", "m", base_url=base, max_retries=0, timeout=5)
                    if api == "anthropic"
                    else OpenAIProvider("k", "m", base_url=f"{base}/v1", max_retries=0,
                                        timeout=5))
        with pytest.raises(ProviderError) as caught:
            await provider.complete(ProviderRequest("s", grown(0), [], "m", provider.params()))
        await provider.aclose()
    assert type(caught.value) is ProviderUnavailable
    assert str(caught.value) == f"{api}: could not connect"
