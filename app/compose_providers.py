"""The composition root, provider half: the model services picked from settings.

The chat provider (Anthropic, OpenAI or the offline fake) with its model, the fallbacks of
``GATEWAY_FALLBACKS``, and speech to text. Kept apart from :mod:`app.compose` because
``gateway replay --rerun`` builds a provider without a gateway, and because a new provider
adds its branch here and nowhere else.
"""

from __future__ import annotations

from app.config import Settings
from gateway.edge.errors import ConfigError
from gateway.edge.provider import Provider
from gateway.media.transcribe import Transcriber

DEFAULT_MODELS = {"anthropic": "claude-sonnet-4-5", "openai": "gpt-4o-mini", "offline": "offline-1"}


def build_provider(settings: Settings, name: str | None = None,
                   model: str | None = None) -> Provider:
    """The provider ``name`` (default: the configured one) with ``model`` (default: the
    configured model, else the provider's default)."""
    name = name or settings.resolved_provider()
    model = model or (settings.model if name == settings.resolved_provider() else None) \
        or DEFAULT_MODELS[name]
    if name == "anthropic":
        from providers.anthropic import AnthropicProvider

        if settings.anthropic_api_key is None:
            raise ConfigError(f"the {name} provider (GATEWAY_PROVIDER or GATEWAY_FALLBACKS) "
                              "needs ANTHROPIC_API_KEY")
        return AnthropicProvider(
            api_key=settings.anthropic_api_key.get_secret_value(), model=model,
            base_url=settings.anthropic_base_url, max_tokens=settings.max_tokens,
            temperature=settings.temperature, stream=settings.stream,
            timeout=settings.provider_timeout, max_retries=settings.provider_retries,
        )
    if name == "openai":
        from providers.openai import OpenAIProvider

        key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else "none"
        return OpenAIProvider(
            api_key=key, model=model, base_url=settings.openai_base_url,
            max_tokens=settings.max_tokens, temperature=settings.temperature,
            stream=settings.stream, timeout=settings.provider_timeout,
            max_retries=settings.provider_retries,
            max_tokens_field=settings.openai_max_tokens_field,
            reasoning_effort=settings.openai_reasoning_effort,
        )
    from providers.offline import OfflineProvider

    return OfflineProvider(model=model)


def build_fallbacks(settings: Settings) -> list[Provider]:
    """The providers of ``GATEWAY_FALLBACKS``, in order."""
    return [build_provider(settings, name, model) for name, model in settings.fallback_list]


def build_transcriber(settings: Settings, provider: Provider) -> Transcriber | None:
    """Speech to text: the OpenAI endpoint when ``GATEWAY_TRANSCRIPTION_MODEL`` is set, the
    offline fake with the offline provider (so ``make run`` shows voice notes), else none."""
    if settings.transcription_model:
        from providers.transcription import OpenAITranscriber

        key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else "none"
        return OpenAITranscriber(api_key=key, model=settings.transcription_model,
                                 base_url=settings.openai_base_url,
                                 timeout=settings.provider_timeout,
                                 max_retries=settings.provider_retries)
    if provider.name == "offline":
        from providers.offline import OfflineTranscriber

        return OfflineTranscriber()
    return None
