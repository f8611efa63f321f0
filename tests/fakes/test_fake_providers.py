"""The fake provider servers, driven by the real anthropic and openai SDKs."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import anthropic
import httpx2
import openai
import orjson
import pytest
from anthropic.types import MessageParam, RawMessageStreamEvent
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessageParam

from tests.fakes.providers import FOREVER, FakeProviderServer, Reply, ToolCall

# Quotes, newlines, a tab, non-ASCII and an emoji: anything a re-encoding would alter.
SYSTEM = 'You are "Gatekeeper".\n\tAnswer in Français — briefly. 🤖 \\n stays literal'
QUESTION = "what time is it?"
CLAUDE_USER: list[MessageParam] = [{"role": "user", "content": QUESTION}]
GPT_USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": QUESTION}]


@pytest.fixture
async def srv() -> AsyncIterator[FakeProviderServer]:
    async with FakeProviderServer() as server:
        yield server


@pytest.fixture
async def claude(srv: FakeProviderServer) -> AsyncIterator[anthropic.AsyncAnthropic]:
    client = anthropic.AsyncAnthropic(
        api_key="test", base_url=srv.anthropic_base_url, max_retries=0
    )
    yield client
    await client.close()


@pytest.fixture
async def gpt(srv: FakeProviderServer) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(api_key="test", base_url=srv.openai_base_url, max_retries=0)
    yield client
    await client.close()


async def ask_claude(client: anthropic.AsyncAnthropic) -> anthropic.types.Message:
    return await client.messages.create(model="claude-test", max_tokens=100, messages=CLAUDE_USER)


async def stream_claude(
    client: anthropic.AsyncAnthropic,
) -> anthropic.AsyncStream[RawMessageStreamEvent]:
    return await client.messages.create(
        model="claude-test", max_tokens=100, messages=CLAUDE_USER, stream=True
    )


async def ask_gpt(client: openai.AsyncOpenAI) -> ChatCompletion:
    return await client.chat.completions.create(model="gpt-test", messages=GPT_USER)


async def stream_gpt(
    client: openai.AsyncOpenAI, *, include_usage: bool = False
) -> openai.AsyncStream[ChatCompletionChunk]:
    if include_usage:
        return await client.chat.completions.create(
            model="gpt-test",
            messages=GPT_USER,
            stream=True,
            stream_options={"include_usage": True},
        )
    return await client.chat.completions.create(model="gpt-test", messages=GPT_USER, stream=True)


# -- Anthropic ------------------------------------------------------------------------


async def test_anthropic_text_and_request_recorded_verbatim(
    srv: FakeProviderServer, claude: anthropic.AsyncAnthropic
) -> None:
    """A scripted text reply parses in the SDK and the request body is recorded unaltered."""
    srv.script("anthropic", Reply.text("It is noon."))
    message = await claude.messages.create(
        model="claude-test", max_tokens=100, messages=CLAUDE_USER, system=SYSTEM
    )

    assert message.id == "msg_fake000001"
    assert message.content[0].type == "text"
    assert message.content[0].text == "It is noon."
    assert message.stop_reason == "end_turn"
    [req] = srv.requests
    assert (req.api, req.path, req.stream) == ("anthropic", "/v1/messages", False)
    assert req.body == {
        "model": "claude-test",
        "max_tokens": 100,
        "messages": CLAUDE_USER,
        "system": SYSTEM,
    }
    assert req.body["system"].encode() == SYSTEM.encode()
    assert orjson.loads(req.raw) == req.body
    assert req.headers["content-type"] == "application/json"
    assert message.usage.input_tokens == len(req.raw) // 4
    assert message.usage.output_tokens == len("It is noon.") // 4 + 1


async def test_anthropic_tool_use(
    srv: FakeProviderServer, claude: anthropic.AsyncAnthropic
) -> None:
    """A tool_use reply with leading text parses as TextBlock + ToolUseBlock (stop: tool_use)."""
    srv.script("anthropic", Reply.tool_use("clock", {"tz": "UTC"}, text_before="Checking."))
    message = await ask_claude(claude)

    text, tool = message.content
    assert text.type == "text"
    assert text.text == "Checking."
    assert tool.type == "tool_use"
    assert (tool.id, tool.name, tool.input) == ("toolu_fake000001", "clock", {"tz": "UTC"})
    assert message.stop_reason == "tool_use"


async def test_anthropic_streaming_text(
    srv: FakeProviderServer, claude: anthropic.AsyncAnthropic
) -> None:
    """messages.stream() yields the text in several deltas and a complete final message."""
    srv.script("anthropic", Reply.text("one two three four"))
    async with claude.messages.stream(
        model="claude-test", max_tokens=100, messages=CLAUDE_USER
    ) as stream:
        pieces = [piece async for piece in stream.text_stream]
        final = await stream.get_final_message()

    assert len(pieces) == 4
    assert "".join(pieces) == "one two three four"
    assert final.content[0].type == "text"
    assert final.content[0].text == "one two three four"
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == len("one two three four") // 4 + 1
    assert srv.requests[0].body["stream"] is True


async def test_anthropic_streaming_tool_calls(
    srv: FakeProviderServer, claude: anthropic.AsyncAnthropic
) -> None:
    """create(stream=True) emits the exact Anthropic event sequence; partial JSON reassembles."""
    args = {"city": "Zürich", "days": [1, 2, 3]}
    srv.script(
        "anthropic",
        Reply.tool_uses(ToolCall("weather", args), ToolCall("clock", {}, id="toolu_mine")),
    )
    events = [event async for event in await stream_claude(claude)]

    kinds = [event.type for event in events]
    assert kinds[0] == "message_start"
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 2
    json_parts = [
        e.delta.partial_json
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta" and e.index == 0
    ]
    assert len(json_parts) > 2
    assert orjson.loads("".join(json_parts)) == args
    assert events[-2].type == "message_delta"
    assert events[-2].delta.stop_reason == "tool_use"

    srv.script("anthropic", Reply.tool_use("weather", args))
    async with claude.messages.stream(
        model="claude-test", max_tokens=100, messages=CLAUDE_USER
    ) as helper:
        final = await helper.get_final_message()
    [tool] = final.content
    assert tool.type == "tool_use"
    assert (tool.name, tool.input) == ("weather", args)


@pytest.mark.parametrize(
    ("status", "error_class", "error_type"),
    [
        (429, anthropic.RateLimitError, "rate_limit_error"),
        (500, anthropic.InternalServerError, "api_error"),
        (529, anthropic.APIStatusError, "overloaded_error"),
    ],
)
async def test_anthropic_errors(
    srv: FakeProviderServer,
    claude: anthropic.AsyncAnthropic,
    status: int,
    error_class: type[anthropic.APIStatusError],
    error_type: str,
) -> None:
    """Each error status raises the SDK's class and carries Anthropic's error JSON and headers."""
    srv.script("anthropic", Reply.error(status, headers={"retry-after": "7"}))
    with pytest.raises(error_class) as caught:
        await ask_claude(claude)

    assert caught.value.status_code == status
    assert caught.value.body == {
        "type": "error",
        "error": {"type": error_type, "message": caught.value.api_message},
    }
    assert caught.value.type == error_type
    assert caught.value.response.headers["retry-after"] == "7"
    assert caught.value.request_id == "req_fake000001"


# -- OpenAI ---------------------------------------------------------------------------


async def test_openai_text_and_request_recorded_verbatim(
    srv: FakeProviderServer, gpt: openai.AsyncOpenAI
) -> None:
    """A scripted text reply parses in the SDK and the request body is recorded unaltered."""
    srv.script("openai", Reply.text("It is noon."))
    messages: list[ChatCompletionMessageParam] = [{"role": "system", "content": SYSTEM}, *GPT_USER]
    completion = await gpt.chat.completions.create(
        model="gpt-test", messages=messages, temperature=0.25
    )

    assert completion.id == "chatcmpl-fake000001"
    [choice] = completion.choices
    assert choice.message.content == "It is noon."
    assert choice.finish_reason == "stop"
    [req] = srv.requests
    assert (req.api, req.path) == ("openai", "/v1/chat/completions")
    assert req.body == {"model": "gpt-test", "messages": messages, "temperature": 0.25}
    assert req.body["messages"][0]["content"].encode() == SYSTEM.encode()
    assert req.headers["authorization"] == "Bearer test"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == len(req.raw) // 4


async def test_openai_tool_calls(srv: FakeProviderServer, gpt: openai.AsyncOpenAI) -> None:
    """Several tool calls arrive as function tool_calls with JSON-string arguments."""
    srv.script("openai", Reply.tool_uses(ToolCall("a", {"x": 1}), ToolCall("b", {"y": "z"})))
    completion = await ask_gpt(gpt)

    [choice] = completion.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = []
    for call in choice.message.tool_calls or []:
        assert call.type == "function"
        calls.append((call.id, call.function.name, call.function.arguments))
    assert calls == [
        ("call_fake000001", "a", '{"x":1}'),
        ("call_fake000002", "b", '{"y":"z"}'),
    ]


async def test_openai_streaming_text_with_usage(
    srv: FakeProviderServer, gpt: openai.AsyncOpenAI
) -> None:
    """stream=True yields content deltas, a finish chunk and, when asked, a final usage chunk."""
    srv.script("openai", Reply.text("one two three"))
    stream = await stream_gpt(gpt, include_usage=True)
    chunks = [chunk async for chunk in stream]

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "one two three"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == len("one two three") // 4 + 1

    # Without include_usage no chunk carries usage, as with the real API.
    srv.script("openai", Reply.text("plain"))
    stream = await stream_gpt(gpt)
    assert all([chunk.usage is None async for chunk in stream])


async def test_openai_streaming_tool_calls(
    srv: FakeProviderServer, gpt: openai.AsyncOpenAI
) -> None:
    """Streamed tool_calls deltas reassemble, both by hand and via the SDK's stream helper."""
    args = {"city": "Zürich", "days": [1, 2, 3]}
    srv.script("openai", Reply.tool_uses(ToolCall("weather", args), ToolCall("clock", {})))
    stream = await stream_gpt(gpt)
    by_index: dict[int, str] = {}
    names: dict[int, str] = {}
    async for chunk in stream:
        for delta in chunk.choices[0].delta.tool_calls or []:
            assert delta.function is not None
            if delta.function.name:
                names[delta.index] = delta.function.name
            by_index[delta.index] = by_index.get(delta.index, "") + (delta.function.arguments or "")
    assert names == {0: "weather", 1: "clock"}
    assert orjson.loads(by_index[0]) == args
    assert orjson.loads(by_index[1]) == {}

    srv.script("openai", Reply.tool_use("weather", args, id="call_mine"))
    async with gpt.chat.completions.stream(model="gpt-test", messages=GPT_USER) as helper:
        final = await helper.get_final_completion()
    [call] = final.choices[0].message.tool_calls or []
    assert call.id == "call_mine"
    assert orjson.loads(call.function.arguments) == args


@pytest.mark.parametrize(
    ("status", "error_class", "error_type"),
    [
        (429, openai.RateLimitError, "requests"),
        (500, openai.InternalServerError, "server_error"),
        (529, openai.InternalServerError, "server_error"),
    ],
)
async def test_openai_errors(
    srv: FakeProviderServer,
    gpt: openai.AsyncOpenAI,
    status: int,
    error_class: type[openai.APIStatusError],
    error_type: str,
) -> None:
    """Each error status raises the SDK's class and carries OpenAI's error JSON and headers."""
    srv.script("openai", Reply.error(status, headers={"retry-after": "7"}))
    with pytest.raises(error_class) as caught:
        await ask_gpt(gpt)

    assert caught.value.status_code == status
    # The SDK unwraps {"error": {...}} into .body.
    assert isinstance(caught.value.body, dict)
    assert set(caught.value.body) == {"message", "type", "param", "code"}
    assert caught.value.type == error_type
    assert caught.value.response.headers["retry-after"] == "7"
    assert caught.value.request_id == "req_fake000001"


# -- faults, shared behaviour ---------------------------------------------------------


async def test_hang_triggers_client_timeout(
    srv: FakeProviderServer, claude: anthropic.AsyncAnthropic, gpt: openai.AsyncOpenAI
) -> None:
    """Reply.hang outlasts a short client timeout, so both SDKs raise APITimeoutError."""
    # An hour's hang, ended only by the server's close after the test: an error now is the
    # client giving up (no clock is read, so a busy machine cannot blur the two).
    srv.script("anthropic", Reply.hang(FOREVER))
    srv.script("openai", Reply.hang(FOREVER))
    with pytest.raises(anthropic.APITimeoutError):
        await ask_claude(claude.with_options(timeout=0.2))
    with pytest.raises(openai.APITimeoutError):
        await ask_gpt(gpt.with_options(timeout=0.2))
    assert len(srv.requests) == 2  # recorded even though never answered


async def test_short_hang_then_answers(
    srv: FakeProviderServer, claude: anthropic.AsyncAnthropic
) -> None:
    """A hang shorter than the timeout delays the `then` reply but still delivers it."""
    srv.script("anthropic", Reply.hang(0.05, then=Reply.text("late")))
    started = time.monotonic()
    message = await ask_claude(claude)
    assert time.monotonic() - started >= 0.05
    assert message.content[0].type == "text"
    assert message.content[0].text == "late"


async def test_cut_stream_raises_in_anthropic_sdk(
    srv: FakeProviderServer, claude: anthropic.AsyncAnthropic
) -> None:
    """A stream cut after N events delivers those events, then the SDK iteration raises."""
    srv.script("anthropic", Reply.cut_stream(after_chunks=3, then=Reply.text("never finished")))
    stream = await stream_claude(claude)
    received: list[str] = []

    async def consume() -> None:
        async for event in stream:
            received.append(event.type)

    # anthropic 2.14 lets the transport's RemoteProtocolError escape from stream iteration.
    with pytest.raises((anthropic.APIConnectionError, httpx2.TransportError)):
        await consume()
    # The three events sent were message_start, content_block_start and ping (skipped by the SDK).
    assert received == ["message_start", "content_block_start"]


async def test_cut_stream_raises_in_openai_sdk(
    srv: FakeProviderServer, gpt: openai.AsyncOpenAI
) -> None:
    """A stream cut after N chunks delivers N chunks, then the SDK raises APIConnectionError."""
    srv.script("openai", Reply.cut_stream(after_chunks=2, then=Reply.text("a b c d")))
    stream = await stream_gpt(gpt)
    received: list[ChatCompletionChunk] = []

    async def consume() -> None:
        async for chunk in stream:
            received.append(chunk)

    with pytest.raises(openai.APIConnectionError):
        await consume()
    assert len(received) == 2


async def test_cut_non_streamed_body_raises_connection_error(
    srv: FakeProviderServer, claude: anthropic.AsyncAnthropic, gpt: openai.AsyncOpenAI
) -> None:
    """cut_stream on a non-streamed request truncates the JSON body: APIConnectionError."""
    srv.script("anthropic", Reply.cut_stream())
    srv.script("openai", Reply.cut_stream())
    with pytest.raises(anthropic.APIConnectionError):
        await ask_claude(claude)
    with pytest.raises(openai.APIConnectionError):
        await ask_gpt(gpt)


async def test_default_echo_and_script_order(
    srv: FakeProviderServer, claude: anthropic.AsyncAnthropic, gpt: openai.AsyncOpenAI
) -> None:
    """Scripted replies are used in order per api; afterwards the echo default answers."""
    srv.script("anthropic", Reply.text("first"), Reply.text("second"))
    assert srv.pending("anthropic") == 2
    texts = []
    for _ in range(3):
        message = await ask_claude(claude)
        assert message.content[0].type == "text"
        texts.append(message.content[0].text)
    assert texts == ["first", "second", f"echo: {QUESTION}"]
    assert srv.pending("anthropic") == 0

    parts: list[ChatCompletionMessageParam] = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}],
        }
    ]
    completion = await gpt.chat.completions.create(model="gpt-test", messages=parts)
    assert completion.choices[0].message.content == "echo: part one part two"
    assert [r.api for r in srv.requests] == ["anthropic"] * 3 + ["openai"]


async def test_default_is_configurable(
    srv: FakeProviderServer, claude: anthropic.AsyncAnthropic, gpt: openai.AsyncOpenAI
) -> None:
    """srv.default decides the answer from (api, body) when nothing is scripted."""
    srv.default = lambda api, body: Reply.text(f"{api} saw {body['model']}")
    message = await ask_claude(claude)
    completion = await ask_gpt(gpt)
    assert message.content[0].type == "text"
    assert message.content[0].text == "anthropic saw claude-test"
    assert completion.choices[0].message.content == "openai saw gpt-test"


async def test_ids_and_usage_are_deterministic() -> None:
    """Two fresh servers answer the same request byte-identically (ids, usage, created)."""
    answers = []
    for _ in range(2):
        async with FakeProviderServer() as server:
            srv_claude = anthropic.AsyncAnthropic(
                api_key="test", base_url=server.anthropic_base_url, max_retries=0
            )
            srv_gpt = openai.AsyncOpenAI(
                api_key="test", base_url=server.openai_base_url, max_retries=0
            )
            server.script("anthropic", Reply.tool_use("t", {"k": "v"}))
            server.script("openai", Reply.tool_use("t", {"k": "v"}))
            message = await ask_claude(srv_claude)
            completion = await ask_gpt(srv_gpt)
            answers.append((message.model_dump(), completion.model_dump()))
            await srv_claude.close()
            await srv_gpt.close()
    assert answers[0] == answers[1]
    message_dump, completion_dump = answers[0]
    assert message_dump["content"][0]["id"] == "toolu_fake000001"
    assert completion_dump["choices"][0]["message"]["tool_calls"][0]["id"] == "call_fake000001"
    assert completion_dump["created"] == 1_700_000_000


async def test_custom_error_body_is_sent_verbatim(
    srv: FakeProviderServer, gpt: openai.AsyncOpenAI
) -> None:
    """A str error body (e.g. a proxy's HTML page) reaches the SDK unchanged."""
    srv.script("openai", Reply.error(502, "<html>Bad Gateway</html>"))
    with pytest.raises(openai.InternalServerError) as caught:
        await ask_gpt(gpt)
    assert caught.value.status_code == 502
    assert caught.value.body == "<html>Bad Gateway</html>"
