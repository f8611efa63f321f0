"""Each provider posts to the URL its SDK would build from the base URL and the API path."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from providers import anthropic as anthropic_provider
from providers import openai as openai_provider

BASES = ["http://127.0.0.1:9", "http://127.0.0.1:9/", "http://127.0.0.1:9/v1",
         "http://127.0.0.1:9/proxy/v1/"]
PROVIDERS = [(openai_provider, openai_provider.OpenAIProvider, "gpt-4o-mini"),
             (anthropic_provider, anthropic_provider.AnthropicProvider, "claude-sonnet-4-5")]


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize(("module", "cls", "model"), PROVIDERS)
async def test_the_url_is_the_sdks_own(module: ModuleType, cls: Any, model: str,
                                       base: str) -> None:
    provider = cls(api_key="k", base_url=base, model=model)
    try:
        assert provider._url == str(provider._client._prepare_url(module._PATH))
    finally:
        await provider.aclose()
