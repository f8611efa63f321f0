"""The providers' SSE reading (providers/sse.py and the two stream classes) against the
SDKs' own decoders and streams: the same events, items and errors for the same bytes."""

from __future__ import annotations

import asyncio
import gc
import json
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gateway.edge.errors import ProviderError, ProviderRateLimited, ProviderUnavailable
from gateway.edge.provider import ProviderRequest
from providers.anthropic import AnthropicProvider, EventStream
from providers.openai import ChunkStream, OpenAIProvider
from providers.sse import SseDecoder, loads
from tests.fakes.providers import FakeProviderServer, Reply

# -- what the SDKs decode: the decoders ---------------------------------------------------

TOKENS = [b"data: ", b"data:", b"event: ", b"event:x", b"id: 1", b"id: \x00", b"retry: 5",
          b"retry: x", b": c", b":", b"\n", b"\r", b"\r\n", b"{}", b'{"a": 1}', b"[DONE]",
          b"ping", b" ", b"\xc3\xa9", b"\xff", b"\xe2\x82", b"x"]


def ours(chunks: Sequence[bytes]) -> tuple[list[tuple[str | None, str]], str | None]:
    decoder = SseDecoder()
    events: list[tuple[str | None, str]] = []
    for chunk in chunks:
        events += decoder.feed(chunk)
        if decoder.failure is not None:
            return events, type(decoder.failure).__name__
    decoder.finish()
    return events, None if decoder.failure is None else type(decoder.failure).__name__


def sdks(module: Any, chunks: Sequence[bytes]) -> tuple[list[tuple[str | None, str]], str | None]:
    events: list[tuple[str | None, str]] = []
    try:
        for sse in module._streaming.SSEDecoder().iter_bytes(iter(chunks)):
            events.append((sse.event, sse.data))
    except UnicodeDecodeError as exc:
        return events, type(exc).__name__
    return events, None


def splits(body: bytes) -> Iterator[list[bytes]]:
    """The body whole, in one-byte chunks, and cut in two at every byte."""
    yield [body]
    yield [body[i:i + 1] for i in range(len(body))]
    for i in range(1, len(body)):
        yield [body[:i], body[i:]]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(st.sampled_from(TOKENS), max_size=12).map(b"".join), max_size=8))
@example([b"data: \r", b"", b"\n"])  # an empty read between a CR and its LF
def test_decoder_is_the_openai_sdks_line_by_line(chunks: list[bytes]) -> None:
    """Any bytes, any chunking: the events and the error of the openai SDK's SSEDecoder."""
    assert ours(chunks) == sdks(openai, chunks)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(st.sampled_from([t for t in TOKENS if t not in (b"\xff", b"\xe2\x82")]),
                         max_size=12).map(b"".join), max_size=8))
@example([b"data: \r", b"", b"\n"])
def test_decoder_is_the_anthropic_sdks_on_utf8(chunks: list[bytes]) -> None:
    """UTF-8 bytes, any chunking: the events of the anthropic SDK's SSEDecoder (which holds
    some back until a later read, so only not-UTF-8 input can tell the two apart)."""
    assert ours(chunks) == sdks(anthropic, chunks)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=4),
    max_leaves=12))
def test_loads_is_json_loads(value: Any) -> None:
    """Any JSON text (big integers, long floats, escapes): the value json.loads reads."""
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False)):
        got = loads(text)
        assert got == value
        assert repr(got) == repr(json.loads(text))  # int stays int, float stays float


@pytest.mark.parametrize("text", ["", "NaN", '{"a": Infinity}', '"\\ud800"', "[1,", "{} x",
                                  '{"n": 123456789012345678901234567890}', "1e400"])
def test_loads_raises_or_reads_as_json_loads(text: str) -> None:
    """Not JSON, or JSON orjson reads differently: json.loads' value or json.loads' error."""
    def read(parse: Any) -> str:
        try:
            return repr(parse(text))
        except json.JSONDecodeError as exc:
            return f"{type(exc).__name__}: {exc}"

    assert read(loads) == read(json.loads)


# -- what the SDKs yield and raise: the streams, over every split of the body ---------------

OPENAI_BODIES = {
    "answer": b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"h\xc3\xa9 "}}]}\n\n'
              b'data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
              b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":3}}\n\ndata: [DONE]\n\n',
    "crlf, cr, comments, multi-line data":
        b': keep-alive\r\n\r\ndata: {"a":1}\r\n\r\n:x\rdata: {"b":\r\ndata: 2}\r\r'
        b"data: [DONE]\r\n\r\n",
    "an id makes every blank line an event": b'id: 7\nretry: 100\ndata: {"a":1}\n\n\n\n',
    "error payload": b'data: {"a":1}\n\ndata: {"error":{"message":"boom","type":"x"}}\n\n',
    "error without a message": b'data: {"error":{"code":1}}\n\ndata: [DONE]\n\n',
    "assistants event": b'event: thread.run.created\ndata: {"id":"r"}\n\ndata: [DONE]\n\n',
    "data not JSON": b'data: {"a":1}\n\ndata: {"a":\n\n',
    "null data": b"data: null\n\ndata: [1]\n\ndata: [DONE]\n\n",
    "cut before a blank line": b'data: {"a":1}\n\ndata: {"b":2}',
    "after [DONE]": b'data: [DONE]\n\ndata: {"late":1}\n\n',
    "big numbers": b'data: {"n":123456789012345678901234567890,"f":1.5e300}\n\n',
    "not UTF-8": b'data: {"a":1}\n\n: \xff\n\ndata: {"b":1}\n\n',
}
ANTHROPIC_BODIES = {
    "answer": b'event: message_start\ndata: {"type":"message_start","message":{"id":"m"}}\n\n'
              b'event: ping\ndata: {"type": "ping"}\n\n'
              b'event: content_block_delta\r\ndata: {"type":"content_block_delta",'
              b'"delta":{"text":"h\xc3\xa9"}}\r\n\r\n'
              b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
    "error event": b'event: message_start\ndata: {"type":"message_start"}\n\n'
                   b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
                   b'"message":"Overloaded"}}\n\n',
    "error event not JSON": b"event: error\ndata: upstream went away\n\n",
    "error event without data": b"event: error\n\n",
    "unnamed and empty events skipped": b'data: {"skipped":1}\n\nevent: message_stop\n\n'
                                        b'event: x\ndata: {"kept":1}\n\n: bye\n',
    "data not JSON": b"event: x\ndata: nope\n\n",
    "cut before a blank line": b'event: x\ndata: {"a":1}\n\nevent: y\ndata: {"b":2}\n',
}


class Body(httpx2.AsyncByteStream):
    """A response body delivered in the given chunks."""

    def __init__(self, chunks: Sequence[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


def sdk_client(api: str, body: list[Sequence[bytes]]) -> Any:
    """The SDK's client on httpx2's MockTransport, answering 200 with ``body[0]``'s chunks."""
    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"},
                               stream=Body(body[0]))

    http = httpx2.AsyncClient(transport=httpx2.MockTransport(answer))
    if api == "openai":
        return openai.AsyncOpenAI(api_key="k", base_url="http://fake/v1", http_client=http,
                                  max_retries=0)
    return anthropic.AsyncAnthropic(api_key="k", base_url="http://fake", http_client=http,
                                    max_retries=0)


async def outcome(client: Any, stream_cls: Any) -> tuple[list[Any], Any]:
    """What iterating the stream gave: the items, then the error (type, text, body, status)."""
    items: list[Any] = []
    try:
        stream = await client.post("/x", content=b"{}", cast_to=object, stream=True,
                                   stream_cls=stream_cls)
        async with stream:
            async for item in stream:
                items.append(item)
    except Exception as exc:
        return items, (type(exc), str(exc), getattr(exc, "body", None),
                       getattr(exc, "status_code", None))
    return items, None


@pytest.mark.parametrize(("api", "name"), [("openai", n) for n in OPENAI_BODIES]
                         + [("anthropic", n) for n in ANTHROPIC_BODIES])
async def test_stream_is_the_sdks_at_every_split(api: str, name: str) -> None:
    """Items, errors (type, message, body, status) and the end: the SDK's own stream's, for
    the body whole, byte by byte and cut in two at every byte."""
    raw = (OPENAI_BODIES if api == "openai" else ANTHROPIC_BODIES)[name]
    module: Any = openai if api == "openai" else anthropic
    theirs_cls, ours_cls = module.AsyncStream[object], (ChunkStream if api == "openai"
                                                        else EventStream)
    current: list[Sequence[bytes]] = [[]]
    client = sdk_client(api, current)
    try:
        for chunks in splits(raw):
            current[0] = chunks
            expected = await outcome(client, theirs_cls)
            assert await outcome(client, ours_cls) == expected, chunks
    finally:
        await client.close()


# -- nothing left open ------------------------------------------------------------------


class Finalised:
    """Records every async generator that asyncio would have to finalise (one that was
    dropped before it ended), through the interpreter's documented asyncgen hooks."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def __enter__(self) -> Finalised:
        self._hooks = sys.get_asyncgen_hooks()
        finalizer = self._hooks.finalizer

        def record(agen: Any) -> None:
            self.names.append(agen.__qualname__)
            if finalizer is not None:
                finalizer(agen)

        sys.set_asyncgen_hooks(firstiter=self._hooks.firstiter, finalizer=record)
        return self

    def __exit__(self, *exc_info: object) -> None:
        sys.set_asyncgen_hooks(*self._hooks)


async def left_behind() -> AsyncIterator[int]:
    yield 1
    yield 2


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_a_streamed_call_leaves_no_generator_to_finalise(api: str) -> None:
    """A streamed call through the real SDK and transport, answered in full and cut short by
    the text sink: every async generator it started has ended (the instrument itself is
    checked on a generator dropped on purpose)."""
    async with FakeProviderServer() as srv:
        provider = provider_for(api, srv)
        request = ProviderRequest("system", [{"role": "user", "content": "hi"}], (),
                                  provider.model, provider.params())

        async def refuse(text: str) -> None:
            raise RuntimeError("sink gave up")

        try:
            with Finalised() as finalised:
                await provider.complete(request)
                with pytest.raises(RuntimeError, match="sink gave up"):
                    await provider.complete(request, refuse)
                gc.collect()
                await asyncio.sleep(0)
                assert finalised.names == []
                dropped = left_behind()
                await anext(dropped)
                del dropped
                gc.collect()
                await asyncio.sleep(0)
                assert finalised.names == ["left_behind"]
        finally:
            await provider.aclose()


# -- errors inside a 200 stream, end to end -------------------------------------------------


def provider_for(api: str, srv: FakeProviderServer) -> AnthropicProvider | OpenAIProvider:
    """The gateway's provider for ``api``, against the fake server, without retries."""
    if api == "openai":
        return OpenAIProvider("k", "gpt-test", base_url=srv.openai_base_url, max_retries=0)
    return AnthropicProvider("k", "claude-test", base_url=srv.anthropic_base_url,
                             max_retries=0)


def anthropic_error(kind: str) -> bytes:
    return (b'event: message_start\ndata: {"type":"message_start","message":{"id":"m"}}\n\n'
            b'event: error\ndata: {"type":"error","error":{"type":"' + kind.encode()
            + b'","message":"m"}}\n\n')


@pytest.mark.parametrize(
    ("api", "pieces", "error"),
    [("anthropic", [anthropic_error("overloaded_error")], ProviderUnavailable),
     ("anthropic", [anthropic_error("rate_limit_error")], ProviderRateLimited),
     ("anthropic", [b"event: error\r\ndata: not json\r\n\r\n"], ProviderError),
     ("openai", [b'data: {"choices":[]}\n\n', b'data: {"error":{"message":"m"}}\n\n'],
      ProviderError)],
)
async def test_error_inside_a_stream(api: str, pieces: list[bytes],
                                     error: type[ProviderError]) -> None:
    """An error the API sends inside a 200 stream becomes the gateway's error for its type."""
    async with FakeProviderServer() as srv:
        provider = provider_for(api, srv)
        srv.script(api, Reply.raw_stream(*pieces))
        request = ProviderRequest("system", [{"role": "user", "content": "hi"}], (),
                                  provider.model, provider.params())
        try:
            with pytest.raises(ProviderError) as caught:
                await provider.complete(request)
        finally:
            await provider.aclose()
    assert type(caught.value) is error
    assert caught.value.__cause__ is not None
