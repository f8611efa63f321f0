"""Golden request bodies: for each provider shape and feature, the body the real SDK put on the
wire (received by the fake server, which also validates it against the SDK's request types)
equals a body written out here by hand, not built by the code under test.

Features covered, per shape: plain text, tools with a tool round, streaming, an image (a
stored attachment expanded from its bytes), and prompt-cache breakpoints (Anthropic; OpenAI
caches by itself and takes no markers, so its body must carry none).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.edge.errors import ProviderError
from gateway.edge.provider import ProviderRequest
from providers.anthropic import AnthropicProvider
from providers.openai import OpenAIProvider
from sessions.records import CachePlan
from tests.fakes.providers import FakeProviderServer

CLOCK = {"name": "clock", "description": "Current time in a zone.",
         "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}},
                          "required": ["tz"]}}
SYSTEM = "You are terse."
PIXEL = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQ"
         "AAAABJRU5ErkJggg==")


@pytest.fixture
async def srv() -> AsyncIterator[FakeProviderServer]:
    async with FakeProviderServer() as server:
        yield server


async def send(srv: FakeProviderServer, api: str, messages: list[dict[str, Any]], *,
               tools: tuple[dict[str, Any], ...] = (), stream: bool = False,
               params: dict[str, Any] | None = None, check: bool = True,
               system: str = SYSTEM, sections: tuple[str, ...] = (),
               cache: CachePlan | None = None,
               blobs: dict[str, bytes] | None = None) -> dict[str, Any]:
    """One call through the real provider and SDK; the body the fake received."""
    provider: AnthropicProvider | OpenAIProvider
    if api == "anthropic":
        provider = AnthropicProvider("sk-test", "claude-test", base_url=srv.anthropic_base_url,
                                     max_tokens=200, stream=stream, max_retries=0)
    else:
        provider = OpenAIProvider("sk-test", "gpt-test", base_url=srv.openai_base_url,
                                  max_tokens=200, stream=stream, max_retries=0)
    try:
        await provider.complete(ProviderRequest(system, messages, tools, provider.model,
                                                params or provider.params(), sections, cache,
                                                blobs or {}))
    finally:
        await provider.aclose()
    if check:
        assert srv.refused == []
    return srv.requests[-1].body


TOOL_ROUND = [
    {"role": "user", "content": "time in Paris?"},
    {"role": "assistant", "content": [
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_1", "name": "clock", "input": {"tz": "Europe/Paris"}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "14:00"}]},
]


async def test_anthropic_text(srv: FakeProviderServer) -> None:
    """Anthropic, plain text: model, max_tokens, system as a string, messages verbatim."""
    body = await send(srv, "anthropic", [{"role": "user", "content": "hi"}])
    assert body == {"model": "claude-test", "max_tokens": 200, "system": "You are terse.",
                    "messages": [{"role": "user", "content": "hi"}]}


async def test_anthropic_tools_and_tool_round(srv: FakeProviderServer) -> None:
    """Anthropic, tools: schemas as given, tool_use and tool_result blocks verbatim."""
    body = await send(srv, "anthropic", TOOL_ROUND, tools=(CLOCK,))
    assert body == {
        "model": "claude-test", "max_tokens": 200, "system": "You are terse.",
        "messages": [
            {"role": "user", "content": "time in Paris?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "clock",
                 "input": {"tz": "Europe/Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "14:00"}]},
        ],
        "tools": [{"name": "clock", "description": "Current time in a zone.",
                   "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}},
                                    "required": ["tz"]}}],
    }


async def test_anthropic_streaming(srv: FakeProviderServer) -> None:
    """Anthropic, streaming: the same body with "stream": true."""
    body = await send(srv, "anthropic", [{"role": "user", "content": "hi"}], stream=True)
    assert body == {"model": "claude-test", "max_tokens": 200, "stream": True,
                    "system": "You are terse.", "messages": [{"role": "user", "content": "hi"}]}


PNG = base64.b64decode(PIXEL)
PNG_HASH = hashlib.sha256(PNG).hexdigest()
PHOTO = [{"role": "user", "content": [
    {"type": "attachment", "hash": PNG_HASH, "name": "dot.png", "media_type": "image/png",
     "size": len(PNG)},
    {"type": "text", "text": "what is this?"}]}]


async def test_anthropic_image(srv: FakeProviderServer) -> None:
    """Anthropic, an image: the stored attachment goes out as a base64 image block."""
    body = await send(srv, "anthropic", PHOTO, blobs={PNG_HASH: PNG})
    assert body["messages"] == [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": PIXEL}},
        {"type": "text", "text": "what is this?"}]}]


async def test_anthropic_cache_breakpoints(srv: FakeProviderServer) -> None:
    """Anthropic, prompt caching: markers on the last tool, after the stable system
    sections (the system prompt then goes as two text blocks, the first ending with the blank
    line between the sections, so they join to the prompt) and on the last message."""
    body = await send(srv, "anthropic", [{"role": "user", "content": "hi"}], tools=(CLOCK,),
                      system="Stable.\n\nDaily.", sections=("Stable.", "Daily."),
                      cache=CachePlan(tools=True, system=1, history=True))
    assert body == {
        "model": "claude-test", "max_tokens": 200,
        "system": [{"type": "text", "text": "Stable.\n\n",
                    "cache_control": {"type": "ephemeral"}},
                   {"type": "text", "text": "Daily."}],
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}],
        "tools": [{"name": "clock", "description": "Current time in a zone.",
                   "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}},
                                    "required": ["tz"]},
                   "cache_control": {"type": "ephemeral"}}],
    }


async def test_openai_image(srv: FakeProviderServer) -> None:
    """OpenAI, an image: the stored attachment goes out as a data-URL image part."""
    body = await send(srv, "openai", PHOTO, blobs={PNG_HASH: PNG})
    assert body["messages"][1:] == [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}},
        {"type": "text", "text": "what is this?"}]}]


async def test_openai_takes_no_cache_markers(srv: FakeProviderServer) -> None:
    """OpenAI, prompt caching: the plan is ignored (the API caches prefixes by itself)."""
    body = await send(srv, "openai", [{"role": "user", "content": "hi"}],
                      system="Stable.\n\nDaily.", sections=("Stable.", "Daily."),
                      cache=CachePlan(tools=True, system=1, history=True))
    assert body == {"model": "gpt-test", "max_completion_tokens": 200, "messages": [
        {"role": "system", "content": "Stable.\n\nDaily."}, {"role": "user", "content": "hi"}]}


async def test_openai_text(srv: FakeProviderServer) -> None:
    """OpenAI, plain text: the system prompt is the first message."""
    body = await send(srv, "openai", [{"role": "user", "content": "hi"}])
    assert body == {"model": "gpt-test", "max_completion_tokens": 200, "messages": [
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}]}


async def test_openai_tools_and_tool_round(srv: FakeProviderServer) -> None:
    """OpenAI, tools: function tools, tool_calls with JSON-string arguments, tool messages."""
    body = await send(srv, "openai", TOOL_ROUND, tools=(CLOCK,))
    assert body == {
        "model": "gpt-test", "max_completion_tokens": 200,
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "time in Paris?"},
            {"role": "assistant", "content": "Checking.", "tool_calls": [
                {"id": "toolu_1", "type": "function",
                 "function": {"name": "clock", "arguments": '{"tz":"Europe/Paris"}'}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "14:00"},
        ],
        "tools": [{"type": "function", "function": {
            "name": "clock", "description": "Current time in a zone.",
            "parameters": {"type": "object", "properties": {"tz": {"type": "string"}},
                           "required": ["tz"]}}}],
    }


async def test_openai_streaming(srv: FakeProviderServer) -> None:
    """OpenAI, streaming: "stream": true and usage requested in the stream."""
    body = await send(srv, "openai", [{"role": "user", "content": "hi"}], stream=True)
    assert body == {"model": "gpt-test", "max_completion_tokens": 200, "stream": True,
                    "stream_options": {"include_usage": True}, "messages": [
                        {"role": "system", "content": "You are terse."},
                        {"role": "user", "content": "hi"}]}


async def test_anthropic_tool_without_input_schema_is_refused_with_a_400(
    srv: FakeProviderServer
) -> None:
    """A tool without input_schema (a body the real API rejects) gets a 400 naming the field,
    so no end-to-end test can pass with it."""
    with pytest.raises(ProviderError) as info:
        await send(srv, "anthropic", [{"role": "user", "content": "hi"}],
                   tools=({"name": "clock", "description": "no schema"},), check=False)
    assert info.value.status == 400
    ((_, problems),) = srv.refused
    assert "input_schema: Field required" in " ".join(problems)


@pytest.mark.parametrize("api", ["anthropic", "openai"])
async def test_a_wrongly_typed_param_is_refused_with_a_400(
    srv: FakeProviderServer, api: str
) -> None:
    """max_tokens sent as a string (the APIs take an integer, no coercion) gets a 400."""
    with pytest.raises(ProviderError) as info:
        await send(srv, api, [{"role": "user", "content": "hi"}],
                   params={"max_tokens": "200"}, check=False)
    assert info.value.status == 400
    ((_, problems),) = srv.refused
    assert problems == ["max_tokens: Input should be a valid integer"]
