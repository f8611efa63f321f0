"""Each provider posts to the URL its SDK would build from the base URL and the API path."""

from __future__ import annotations

import pytest

from gateway.providers import anthropic as anthropic_provider
from gateway.providers import openai as openai_provider
from gateway.providers.anthropic import AnthropicProvider
from gateway.providers.openai import OpenAIProvider

BASES = ["http://127.0.0.1:9", "http://127.0.0.1:9/", "http://127.0.0.1:9/v1",
         "http://127.0.0.1:9/proxy/v1/"]


@pytest.mark.parametrize("base", BASES)
async def test_openai_url(base: str) -> None:
    provider = OpenAIProvider(api_key="k", base_url=base, model="gpt-4o-mini")
    try:
        expected = provider._client._prepare_url(openai_provider._PATH)
        assert provider._url == str(expected)
    finally:
        await provider.aclose()


@pytest.mark.parametrize("base", BASES)
async def test_anthropic_url(base: str) -> None:
    provider = AnthropicProvider(api_key="k", base_url=base, model="claude-sonnet-4-5")
    try:
        expected = provider._client._prepare_url(anthropic_provider._PATH)
        assert provider._url == str(expected)
    finally:
        await provider.aclose()
