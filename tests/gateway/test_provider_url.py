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
    # The SDK's own client for the same base URL; its URL building is the reference (the
    # SDK has no public accessor for it: ``_prepare_url`` is the SDK's, not ours).
    sdk = sdk_of(module)(api_key="k", base_url=base)
    try:
        assert provider.url == str(sdk._prepare_url(module.API_PATH))
    finally:
        await provider.aclose()
        await sdk.close()


def sdk_of(module: ModuleType) -> Any:
    import anthropic
    import openai

    return openai.AsyncOpenAI if module is openai_provider else anthropic.AsyncAnthropic
