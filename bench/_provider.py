"""The provider side of the channel benchmarks: what every user runs, an official SDK over HTTP.

The gateway subject talks to a local fake provider server (``tests/fakes/providers.py``,
which speaks the Anthropic and OpenAI wire protocols, SSE streaming included) through the
real ``openai`` SDK by default, as ``gateway run`` does with ``OPENAI_BASE_URL`` set. The fake
runs in the driver process, beside the fake platform, so its CPU is not the subject's.
Diagnostic variants of the gateway swap the provider:

``gateway/anthropic``
    the real ``anthropic`` SDK against the same fake (prompt-cache breakpoints on);
``gateway/scripted``
    the in-process ``ScriptedProvider``: no SDK, no HTTP (the old benchmark's subject);
``gateway/fsync-off``
    the shipped provider, with ``GATEWAY_DURABILITY=none``: what the two fsyncs at the end of
    every turn (the owed journal's and the session log's) and their thread hops cost.

Only the standard library is imported at module level: the subjects' children import this
module, and it must not add to their RSS.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

PROVIDER_VARIANTS = (
    ("gateway/anthropic", "gateway with the Anthropic SDK (cache breakpoints) instead of OpenAI's"),
    ("gateway/scripted", "gateway with the in-process ScriptedProvider (no SDK, no HTTP)"),
    ("gateway/fsync-off", "gateway with GATEWAY_DURABILITY=none (no fsync at a turn's end)"),
)
"""Diagnostic rows (``--diagnose``), paired with the gateway as shipped to the benchmark."""
MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-sonnet-4-5"}
PROVIDER_PROFILE_GROUPS = (
    ("provider call: SDK post, SSE stream, answer assembled", "gateway/providers/sdk.py",
     "complete"),
    ("... of which the SDK client's request (auth, retries, HTTP)", "openai/_base_client.py",
     "request"),
)
"""Profile rows (label, path suffix, function) of the provider call, for ``--profile``."""


def provider_of(variant: str) -> str:
    """The provider a gateway variant uses: ``openai`` unless the variant names another."""
    return variant if variant in ("anthropic", "scripted") else "openai"


def provider_settings(cfg: dict[str, Any]) -> dict[str, Any]:
    """Settings (environment names) that point the gateway at the driver's fake provider."""
    kind = provider_of(cfg.get("variant", ""))
    if kind == "scripted":
        return {}
    if cfg.get("variant") == "fsync-off":
        return {**provider_settings({**cfg, "variant": ""}), "GATEWAY_DURABILITY": "none"}
    base = cfg["provider_base_url"]
    if kind == "anthropic":
        return {"GATEWAY_PROVIDER": "anthropic", "ANTHROPIC_API_KEY": "bench-key",
                "ANTHROPIC_BASE_URL": base, "GATEWAY_MODEL": MODELS["anthropic"]}
    return {"GATEWAY_PROVIDER": "openai", "OPENAI_API_KEY": "bench-key",
            "OPENAI_BASE_URL": f"{base}/v1", "GATEWAY_MODEL": MODELS["openai"]}


def provider_override(cfg: dict[str, Any]) -> Any:
    """The provider object to inject (the scripted variant), else None: the settings decide."""
    if provider_of(cfg.get("variant", "")) != "scripted":
        return None
    from tests.fakes.scripted_provider import ScriptedProvider

    return ScriptedProvider(keep_bodies=False)


@contextlib.asynccontextmanager
async def fake_provider() -> AsyncIterator[Any]:
    """The fake provider server (echoes the last user text), in the driver process."""
    from tests.fakes.providers import FakeProviderServer

    async with FakeProviderServer() as server:
        yield server


def provider_calls(server: Any) -> int:
    """How many requests the fake answered (both APIs)."""
    return len(server.requests)
