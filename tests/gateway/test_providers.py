"""The providers against local fake servers driven by the real SDKs, and the offline provider."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest

from gateway.edge.errors import (
    ConfigError,
    ProviderError,
    ProviderRateLimited,
    ProviderStreamCut,
    ProviderTimeout,
    ProviderUnavailable,
)
from gateway.edge.provider import ProviderRequest, ProviderResponse
from gateway.persona.tools import KbSearch, KbWrite, MemoryWrite, MoodSet, SoulPatch
from gateway.schedule.tools import ScheduleCreate
from providers.anthropic import AnthropicProvider
from providers.common import parse_tool_input
from providers.offline import OfflineProvider
from providers.openai import OpenAIProvider
from sessions.records import MessageDict, ToolSchema
from sessions.shapes import encode_body, request_body
from tests.fakes.providers import FOREVER, FakeProviderServer, Reply, ToolCall

Remote = AnthropicProvider | OpenAIProvider
Make = Callable[..., Remote]

KEY = "sk-test-SECRET-0123456789"
# Quotes, a tab, newlines, non-ASCII, an emoji and a literal backslash-n: re-encoding shows.
SYSTEM = 'You are "Gatekeeper", a bot.\n\tRéponds brièvement — 🤖 \\n stays literal\n'
USER: list[MessageDict] = [{"role": "user", "content": "what time is it?"}]
CLOCK: ToolSchema = {
    "name": "clock",
    "description": "Current time in a zone.",
    "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}}},
}
APIS = ["anthropic", "openai"]


@pytest.fixture
async def srv() -> AsyncIterator[FakeProviderServer]:
    async with FakeProviderServer() as server:
        yield server


@pytest.fixture
async def make(srv: FakeProviderServer) -> AsyncIterator[Make]:
    """Builds providers pointed at the fake (no retries unless asked) and closes them after."""
    made: list[Remote] = []

    def build(api: str, **options: Any) -> Remote:
        options.setdefault("max_retries", 0)
        provider: Remote
        if api == "anthropic":
            provider = AnthropicProvider(
                KEY, "claude-test", base_url=srv.anthropic_base_url, **options
            )
        else:
            provider = OpenAIProvider(KEY, "gpt-test", base_url=srv.openai_base_url, **options)
        made.append(provider)
        return provider

    yield build
    for provider in made:
        await provider.aclose()


def ask(
    provider: Remote | OfflineProvider,
    messages: Sequence[MessageDict] = USER,
    tools: Sequence[ToolSchema] = (),
    system: str = SYSTEM,
) -> ProviderRequest:
    return ProviderRequest(system, messages, tools, provider.model, provider.params())


def assert_sent(srv: FakeProviderServer, provider: Remote, requests: list[ProviderRequest]) -> None:
    """Every body the fake received is byte for byte the encoded shaped body of its request."""
    expected = [
        encode_body(request_body(provider.shape, r.system, r.messages, r.tools, r.model,
                                 provider.params()))
        for r in requests
    ]
    assert [r.raw for r in srv.requests] == expected
    for received in srv.requests:
        if provider.shape == "anthropic":
            system = received.body["system"]
        else:
            system = received.body["messages"][0]["content"]
        assert system.encode() == SYSTEM.encode()


class Deltas:
    """An on_text sink recording every delta in order."""

    def __init__(self) -> None:
        self.items: list[str] = []

    async def __call__(self, text: str) -> None:
        self.items.append(text)


def text_of(response: ProviderResponse) -> str:
    return "".join(b["text"] for b in response.message["content"] if b["type"] == "text")


# -- remote providers -----------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
async def test_text_answer(srv: FakeProviderServer, make: Make, api: str) -> None:
    """A non-streamed text answer comes back as one text block with stop reason and usage."""
    # Anthropic's request type has no temperature any more (see the next test).
    options = {"temperature": 0.25} if api == "openai" else {}
    provider = make(api, stream=False, **options)
    srv.script(api, Reply.text("It is noon."))
    request = ask(provider)
    response = await provider.complete(request)

    assert response.message == {
        "role": "assistant",
        "content": [{"type": "text", "text": "It is noon."}],
    }
    assert response.stop_reason == "end_turn"
    assert set(response.usage) == {"input_tokens", "output_tokens"}
    assert response.usage["output_tokens"] == len("It is noon.") // 4 + 1
    assert "stream" not in srv.requests[0].body
    assert srv.requests[0].body.get("temperature") == options.get("temperature")
    assert_sent(srv, provider, [request])


@pytest.mark.parametrize(("api", "variable", "default"), [
    ("anthropic", "ANTHROPIC_BASE_URL", "https://api.anthropic.com:443"),
    ("openai", "OPENAI_BASE_URL", "https://api.openai.com:443"),
])
async def test_endpoint_is_the_origin_of_the_sdk_base_url(
    monkeypatch: pytest.MonkeyPatch, api: str, variable: str, default: str
) -> None:
    """``endpoint`` (what the call entry records) is where the SDK client posts: its default
    when none is configured, its environment variable, else the configured URL, always as
    scheme://host:port with no userinfo, path or query."""
    cls: type[Remote] = AnthropicProvider if api == "anthropic" else OpenAIProvider
    monkeypatch.delenv(variable, raising=False)
    async with cls(KEY, "m") as provider:
        assert provider.endpoint == default
    monkeypatch.setenv(variable, "http://127.0.0.1:9/v1")
    async with cls(KEY, "m") as provider:
        assert provider.endpoint == "http://127.0.0.1:9"
    url = "https://sk-user-SECRET:pw@proxy.example:8443/v1?api_key=sk-SECRET"
    async with cls(KEY, "m", base_url=url) as provider:
        assert provider.endpoint == "https://proxy.example:8443"
    assert OfflineProvider().endpoint is None


async def test_anthropic_refuses_a_temperature_its_api_no_longer_takes() -> None:
    """GATEWAY_TEMPERATURE with Anthropic is a setting error at start, naming the setting
    (every call would be refused: the SDK's request type has no temperature)."""
    with pytest.raises(ConfigError, match="GATEWAY_TEMPERATURE"):
        AnthropicProvider(KEY, "claude-test", temperature=0.5)


@pytest.mark.parametrize("api", APIS)
async def test_streamed_text(srv: FakeProviderServer, make: Make, api: str) -> None:
    """Streamed deltas arrive in order and join to exactly the final message's text."""
    provider = make(api)
    srv.script(api, Reply.text("The answer is 42."))
    deltas = Deltas()
    request = ask(provider)
    response = await provider.complete(request, deltas)

    assert deltas.items == ["The ", "answer ", "is ", "42."]
    assert "".join(deltas.items) == text_of(response) == "The answer is 42."
    assert response.stop_reason == "end_turn"
    assert response.usage["output_tokens"] == len("The answer is 42.") // 4 + 1
    assert response.usage["input_tokens"] == len(srv.requests[0].raw) // 4
    assert srv.requests[0].body["stream"] is True
    assert_sent(srv, provider, [request])


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("api", APIS)
async def test_tool_use_round_trip(
    srv: FakeProviderServer, make: Make, api: str, stream: bool
) -> None:
    """Tool calls become stored tool_use blocks, which go back out with their result unchanged."""
    provider = make(api, stream=stream)
    args = {"tz": "Europe/Zürich", "list": [1, 2.5, None, "x"]}
    srv.script(
        api,
        Reply.tool_uses(ToolCall("clock", args), ToolCall("clock", {}), text_before="Checking."),
    )
    first = ask(provider, tools=[CLOCK])
    deltas = Deltas()
    answer = await provider.complete(first, deltas)

    prefix = "toolu_fake" if api == "anthropic" else "call_fake"
    assert answer.message == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": f"{prefix}000001", "name": "clock", "input": args},
            {"type": "tool_use", "id": f"{prefix}000002", "name": "clock", "input": {}},
        ],
    }
    assert answer.stop_reason == "tool_use"
    assert deltas.items == (["Checking."] if stream else [])

    results: MessageDict = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": f"{prefix}000001", "content": "12:00"},
            {"type": "tool_result", "tool_use_id": f"{prefix}000002", "content": "13:00"},
        ],
    }
    second = ask(provider, [*USER, answer.message, results], tools=[CLOCK])
    final = await provider.complete(second)

    # The fake echoes the last user text; OpenAI carries tool results in "tool" messages.
    echoed = "12:00 13:00" if api == "anthropic" else "what time is it?"
    assert text_of(final) == f"echo: {echoed}"
    assert final.stop_reason == "end_turn"
    assert_sent(srv, provider, [first, second])


@pytest.mark.parametrize(
    ("api", "status", "error"),
    [
        ("anthropic", 429, ProviderRateLimited),
        ("anthropic", 500, ProviderUnavailable),
        ("anthropic", 529, ProviderUnavailable),
        ("anthropic", 400, ProviderError),
        ("openai", 429, ProviderRateLimited),
        ("openai", 500, ProviderUnavailable),
        ("openai", 503, ProviderUnavailable),
        ("openai", 400, ProviderError),
    ],
)
async def test_status_errors(
    srv: FakeProviderServer, make: Make, api: str, status: int, error: type[ProviderError]
) -> None:
    """HTTP errors become the gateway's error classes, carrying the status and the SDK cause."""
    provider = make(api)
    srv.script(api, Reply.error(status))
    request = ask(provider)
    with pytest.raises(ProviderError) as caught:
        await provider.complete(request)

    assert type(caught.value) is error
    assert caught.value.status == status
    assert caught.value.__cause__ is not None
    assert_sent(srv, provider, [request])


@pytest.mark.parametrize("api", APIS)
async def test_api_key_never_in_error(srv: FakeProviderServer, make: Make, api: str) -> None:
    """A 401 whose body quotes the key yields an error whose text does not contain it."""
    provider = make(api)
    body = (
        {"type": "error", "error": {"type": "authentication_error", "message": f"bad key {KEY}"}}
        if api == "anthropic"
        else {"error": {"message": f"Incorrect API key provided: {KEY}", "type": "x", "code": "y"}}
    )
    srv.script(api, Reply.error(401, body=body))
    with pytest.raises(ProviderError) as caught:
        await provider.complete(ask(provider))

    assert caught.value.status == 401
    assert KEY not in str(caught.value)
    assert KEY not in repr(caught.value)


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("api", APIS)
async def test_hang_times_out(srv: FakeProviderServer, make: Make, api: str, stream: bool) -> None:
    """A server that never answers raises ProviderTimeout: the client's timeout ended it (the
    hang lasts until the test is over), after the one request (no retry hid it)."""
    provider = make(api, timeout=0.2, stream=stream)
    srv.script(api, Reply.hang(FOREVER))
    request = ask(provider)
    with pytest.raises(ProviderTimeout):
        await provider.complete(request)
    assert_sent(srv, provider, [request])


@pytest.mark.parametrize(
    ("api", "after", "delivered"),
    [("anthropic", 5, ["a ", "b "]), ("openai", 3, ["a ", "b "])],
)
async def test_cut_stream(
    srv: FakeProviderServer, make: Make, api: str, after: int, delivered: list[str]
) -> None:
    """A stream dropped before its final event raises ProviderStreamCut after the deltas sent."""
    provider = make(api)
    srv.script(api, Reply.cut_stream(after_chunks=after, then=Reply.text("a b c d e f")))
    deltas = Deltas()
    with pytest.raises(ProviderStreamCut):
        await provider.complete(ask(provider), deltas)
    assert deltas.items == delivered


@pytest.mark.parametrize("api", APIS)
async def test_retried_500_then_success(srv: FakeProviderServer, make: Make, api: str) -> None:
    """With max_retries=1 the SDK retries a 500 and the answer comes through; bodies identical."""
    provider = make(api, max_retries=1)
    srv.script(api, Reply.error(500, headers={"retry-after-ms": "10"}), Reply.text("second try"))
    request = ask(provider)
    response = await provider.complete(request)

    assert text_of(response) == "second try"
    assert_sent(srv, provider, [request, request])


@pytest.mark.parametrize("api", APIS)
async def test_params_and_idempotent_aclose(make: Make, api: str) -> None:
    """params() lists exactly the extra body fields; aclose() can be called twice."""
    stream_fields: dict[str, Any] = {"stream": True}
    limit = "max_tokens"
    if api == "openai":
        stream_fields["stream_options"] = {"include_usage": True}
        stream_fields["temperature"] = 0.5
        limit = "max_completion_tokens"  # what current OpenAI models take
    streamed = make(api, **({"temperature": 0.5} if api == "openai" else {}))
    plain = make(api, stream=False, max_tokens=64)

    assert streamed.params() == {limit: 1024, **stream_fields}
    assert plain.params() == {limit: 64}
    await streamed.aclose()
    await streamed.aclose()


# -- offline provider -----------------------------------------------------------------

PERSONA_SYSTEM = "You are Nova, a warm, concise assistant.\nYou answer briefly.\n\n# Memory\n"
PERSONA_TOOLS: list[ToolSchema] = [
    {"name": t.name, "description": t.description, "input_schema": dict(t.input_schema)}
    for t in (MemoryWrite, SoulPatch, KbWrite, KbSearch, MoodSet)
]


def user(text: str) -> list[MessageDict]:
    return [{"role": "user", "content": text}]


async def test_offline_is_deterministic() -> None:
    """The same request gives the same message, deltas, ids and usage every time."""
    provider = OfflineProvider()
    runs = []
    for _ in range(2):
        deltas = Deltas()
        request = ask(provider, user("remember that I like tea"), PERSONA_TOOLS, PERSONA_SYSTEM)
        runs.append((await provider.complete(request, deltas), deltas.items))
    assert runs[0] == runs[1]
    await provider.aclose()
    await provider.aclose()


async def test_offline_remember_calls_memory_write() -> None:
    """Remembering ("remember that X") becomes a memory_write call with a deterministic id."""
    provider = OfflineProvider()
    deltas = Deltas()
    request = ask(provider, user("Remember that I like tea"), PERSONA_TOOLS, PERSONA_SYSTEM)
    response = await provider.complete(request, deltas)

    text, call = response.message["content"]
    assert text["type"] == "text"
    assert "".join(deltas.items) == text["text"]
    assert call["type"] == "tool_use"
    assert (call["name"], call["input"]) == ("memory_write", {"text": "I like tea"})
    assert call["id"].startswith("toolu_off_")
    assert len(call["id"]) == len("toolu_off_") + 12
    assert response.stop_reason == "tool_use"


@pytest.mark.parametrize(
    ("said", "tool", "args"),
    [
        (
            "note in kb: Tea: green, no sugar",
            "kb_write",
            {"title": "Tea", "text": "green, no sugar"},
        ),
        ("search kb for tea", "kb_search", {"query": "tea"}),
        ("set mood to sleepy", "mood_set", {"mood": "sleepy"}),
        ("mood: curious", "mood_set", {"mood": "curious"}),
        ("call yourself Vega.", "soul_patch", {"find": "You are Nova", "replace": "You are Vega"}),
    ],
)
async def test_offline_persona_tools(said: str, tool: str, args: dict[str, str]) -> None:
    """Each phrasing becomes a call that fits the real persona tool's schema."""
    response = await OfflineProvider().complete(
        ask(OfflineProvider(), user(said), PERSONA_TOOLS, PERSONA_SYSTEM)
    )
    call = response.message["content"][-1]
    assert (call["type"], call["name"], call["input"]) == ("tool_use", tool, args)


async def test_offline_needs_the_tool_and_its_fields() -> None:
    """Without memory_write, or with a schema it cannot fill, "remember" gets a text reply."""
    unfillable: ToolSchema = {
        "name": "memory_write",
        "input_schema": {"type": "object", "required": ["text", "importance"]},
    }
    for tools in ([], [unfillable]):
        response = await OfflineProvider().complete(
            ask(OfflineProvider(), user("remember I like tea"), tools, PERSONA_SYSTEM)
        )
        assert response.stop_reason == "end_turn"
        assert [b["type"] for b in response.message["content"]] == ["text"]


async def test_offline_tool_result_gets_text() -> None:
    """A user turn of tool results is answered with "Done: <results>" and end_turn."""
    provider = OfflineProvider()
    first = ask(provider, user("remember that I like tea"), PERSONA_TOOLS, PERSONA_SYSTEM)
    call = await provider.complete(first)
    tool_id = call.message["content"][-1]["id"]
    results: MessageDict = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": tool_id, "content": "saved to memory"}],
    }
    messages = [*first.messages, call.message, results]
    response = await provider.complete(ask(provider, messages, PERSONA_TOOLS, PERSONA_SYSTEM))

    assert response.message == {
        "role": "assistant",
        "content": [{"type": "text", "text": "Done: saved to memory"}],
    }
    assert response.stop_reason == "end_turn"


async def test_offline_plain_reply_uses_prompt_and_text() -> None:
    """A plain message is answered with the persona's name, the quoted text and a count."""
    provider = OfflineProvider()
    deltas = Deltas()
    response = await provider.complete(
        ask(provider, user("hello there"), PERSONA_TOOLS, PERSONA_SYSTEM), deltas
    )

    text = text_of(response)
    assert text == 'Nova here (offline mode). You said: "hello there". I can see 1 message.'
    assert "".join(deltas.items) == text
    assert len(deltas.items) > 1
    assert response.stop_reason == "end_turn"
    assert provider.params() == {"max_tokens": 1024}


SCHEDULE_TOOLS: list[ToolSchema] = [{"name": ScheduleCreate.name,
                                     "description": ScheduleCreate.description,
                                     "input_schema": dict(ScheduleCreate.input_schema)}]


@pytest.mark.parametrize(
    ("said", "args"),
    [
        ("remind me in 2 minutes to stretch",
         {"instruction": "Remind them to stretch", "when": "in 2 minutes"}),
        ("Remind me to call the bank tomorrow at 9.",
         {"instruction": "Remind them to call the bank", "when": "tomorrow at 9"}),
        ("remind me to sit in the sun in 1h 30m",
         {"instruction": "Remind them to sit in the sun", "when": "in 1h 30m"}),
        ("remind me on Friday at 6pm to call mum",
         {"instruction": "Remind them to call mum", "when": "friday at 6pm"}),
        ("remind me every 2 hours to drink water",
         {"instruction": "Remind them to drink water", "every": "2 hours"}),
        ("[Ada (1001)] remind me at 9am to water the plants",
         {"instruction": "Remind them to water the plants", "when": "at 9am"}),
    ],
)
async def test_offline_reminders_call_schedule_create(said: str, args: dict[str, str]) -> None:
    """"Remind me <when> to <what>" (either order) becomes a schedule_create call with the
    time as the person said it (the tool reads it) and the same call every time."""
    provider = OfflineProvider()
    request = ask(provider, user(said), [*PERSONA_TOOLS, *SCHEDULE_TOOLS], PERSONA_SYSTEM)
    first, again = await provider.complete(request), await provider.complete(request)
    call = first.message["content"][-1]
    assert (call["type"], call["name"], call["input"]) == ("tool_use", "schedule_create", args)
    assert first == again


async def test_offline_reminder_without_a_time_or_the_tool_is_a_plain_reply() -> None:
    """No time it can read, or no schedule tool offered: a text reply, no call."""
    provider = OfflineProvider()
    for said, tools in [("remind me to stretch", SCHEDULE_TOOLS),
                        ("remind me in 2 minutes to stretch", PERSONA_TOOLS)]:
        response = await provider.complete(ask(provider, user(said), tools, PERSONA_SYSTEM))
        assert response.stop_reason == "end_turn", said
        assert [b["type"] for b in response.message["content"]] == ["text"]


@pytest.mark.parametrize(
    ("trigger", "answer"),
    [
        ("scheduled: s1a2b3c4 Remind them to stretch", "Reminder: stretch"),
        ("[1001] scheduled: s1a2b3c4 Remind them to stretch", "Reminder: stretch"),
        ("[operator] scheduled: hb-0123 Post the stand-up.",
         "Scheduled task hb-0123: Post the stand-up."),
    ],
)
async def test_offline_answers_a_scheduled_turn(trigger: str, answer: str) -> None:
    """When a reminder fires, its turn is answered with the reminder itself."""
    provider = OfflineProvider()
    response = await provider.complete(ask(provider, user(trigger), SCHEDULE_TOOLS))
    assert text_of(response) == answer
    assert response.stop_reason == "end_turn"


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("api", APIS)
async def test_big_integer_tool_input_goes_back_exactly(
    srv: FakeProviderServer, make: Make, api: str, stream: bool
) -> None:
    """An integer past 64 bits in a tool input is kept as the model wrote it, and the next
    request carries all its digits (orjson would have turned it into a float)."""
    provider = make(api, stream=stream)
    big = 2**70 + 1
    srv.script(api, Reply.tool_use("clock", {"id": big}))
    answer = await provider.complete(ask(provider, tools=[CLOCK]))
    (use,) = [b for b in answer.message["content"] if b["type"] == "tool_use"]
    assert type(use["input"]["id"]) is int
    assert use["input"]["id"] == big
    results: MessageDict = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": use["id"], "content": "ok"}]}
    await provider.complete(ask(provider, [*USER, answer.message, results], tools=[CLOCK]))
    assert str(big).encode() in srv.requests[1].raw


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        ('{"n": 1180591620717411303425}', {"n": 1180591620717411303425}),
        ('{"x": 1.5, "s": "\\ud83d\\ude00"}', {"x": 1.5, "s": "\U0001f600"}),
        ("", {}),
        ('{"n": NaN}', {"_raw": '{"n": NaN}'}),
        ('{"n": 1e400}', {"_raw": '{"n": 1e400}'}),
        ('{"s": "\\ud83d"}', {"_raw": '{"s": "\\ud83d"}'}),
        ("[1, 2]", {"_raw": "[1, 2]"}),
        ('{"unfinished": ', {"_raw": '{"unfinished": '}),
    ],
)
def test_tool_input_is_parsed_exactly_or_kept_as_text(raw: str, parsed: dict[str, Any]) -> None:
    """Tool-call JSON becomes its exact value, or, when the SDKs could not send it back (NaN,
    an infinity, a lone surrogate) or it is not an object, the model's text under _raw."""
    assert parse_tool_input(raw) == parsed
