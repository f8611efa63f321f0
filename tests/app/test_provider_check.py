"""The providers' keys checked at start: a key the provider refuses, or a provider that cannot
be reached, stops `gateway run` with one line naming the setting and what the provider said
(exit 2, no key shown); an answer that proves nothing (no models list) only warns; with
GATEWAY_START_OFFLINE_OK the gateway starts degraded and /healthz says why until a check
passes. Against the fake provider servers, which refuse a wrong key as the APIs do."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from app.cli import main
from app.compose import build_gateway
from app.compose_providers import build_fallbacks
from app.config import Settings
from app.provider_check import Checked, ProviderCheck, check_at_start, providers_to_check
from gateway.edge.errors import ConfigError
from providers.anthropic import AnthropicProvider
from providers.offline import OfflineProvider
from providers.openai import OpenAIProvider
from tests.fakes.providers import FakeProviderServer
from tests.ports import refusing_port
from tests.toolsets.mcp.harness import eventually

RIGHT = "sk-ant-right-key-0123456789"
WRONG = "sk-ant-wrong-key-9876543210"
VARIABLES = ("GATEWAY_PROVIDER", "GATEWAY_FALLBACKS", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL",
             "OPENAI_API_KEY", "OPENAI_BASE_URL", "GATEWAY_START_OFFLINE_OK", "GATEWAY_DATA_DIR",
             "GATEWAY_CHANNELS", "GATEWAY_MODEL")


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory (no .env) and none of the provider settings."""
    monkeypatch.chdir(tmp_path)
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return tmp_path


async def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                  here: Path, **env: str) -> tuple[int, str, str]:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code = await asyncio.to_thread(main, ["run", "--port", "0", "--data-dir", str(here / "d")])
    out, err = capsys.readouterr()
    return code, out, err


async def test_refused_anthropic_key_is_one_line_exit_2(
        here: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A key Anthropic refuses: `gateway run` exits 2 with one line naming ANTHROPIC_API_KEY
    and Anthropic's own message, the key nowhere."""
    async with FakeProviderServer(api_key=RIGHT) as fake:
        code, out, err = await run_cli(monkeypatch, capsys, here, ANTHROPIC_API_KEY=WRONG,
                                       ANTHROPIC_BASE_URL=fake.anthropic_base_url)
    assert (code, out, err.count("\n")) == (2, "", 1)
    assert err.startswith("gateway run: ANTHROPIC_API_KEY was refused (anthropic: HTTP 401 "
                          "authentication_error: invalid x-api-key); GATEWAY_START_OFFLINE_OK=1")
    assert WRONG not in err
    assert fake.model_listings == [("anthropic", 401)]
    assert fake.requests == []  # no message was ever sent


async def test_refused_openai_fallback_key_names_the_fallback(
        here: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The configured provider passes, the OpenAI fallback's key is refused: the line names
    GATEWAY_FALLBACKS and OPENAI_API_KEY and quotes OpenAI's message with the masked key
    cut out."""
    wrong_openai = "sk-proj-wrong-openai-key-000000"
    async with FakeProviderServer(api_key=RIGHT) as fake:
        code, _, err = await run_cli(
            monkeypatch, capsys, here, ANTHROPIC_API_KEY=RIGHT,
            ANTHROPIC_BASE_URL=fake.anthropic_base_url, OPENAI_API_KEY=wrong_openai,
            OPENAI_BASE_URL=fake.openai_base_url, GATEWAY_FALLBACKS="openai:gpt-4o-mini")
    assert code == 2
    assert err.startswith("gateway run: GATEWAY_FALLBACKS: OPENAI_API_KEY was refused (openai: "
                          "HTTP 401 invalid_api_key: Incorrect API key provided: [key]. ")
    assert wrong_openai not in err
    assert wrong_openai[-4:] not in err
    assert fake.model_listings == [("anthropic", 200), ("openai", 401)]


async def test_unreachable_provider_names_the_url_setting(
        here: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A provider that cannot be reached: one line naming it, where, and ANTHROPIC_BASE_URL."""
    with refusing_port() as port:
        code, _, err = await run_cli(monkeypatch, capsys, here, ANTHROPIC_API_KEY=RIGHT,
                                     ANTHROPIC_BASE_URL=f"http://127.0.0.1:{port}")
    assert (code, err.count("\n")) == (2, 1)
    assert err.startswith(f"gateway run: anthropic cannot be reached at http://127.0.0.1:{port} "
                          "(ANTHROPIC_BASE_URL): anthropic: could not connect")


def _settings(here: Path, fake: FakeProviderServer, **extra: str) -> Settings:
    values: dict[str, Any] = {"ANTHROPIC_API_KEY": RIGHT,
                              "ANTHROPIC_BASE_URL": fake.anthropic_base_url, **extra}
    return Settings(_env_file=None, GATEWAY_DATA_DIR=str(here / "data"), GATEWAY_PORT=0,  # type: ignore[call-arg]
                    **values)


async def test_accepted_key_passes_and_no_models_list_only_warns(
        here: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The right key passes with one models request; an OpenAI-compatible server without a
    models list (404) proves nothing: a warning, and nothing stops the start."""
    caplog.set_level(logging.WARNING, logger="gateway.app")
    async with FakeProviderServer(api_key=RIGHT) as fake:
        anthropic = AnthropicProvider(api_key=RIGHT, model="m", base_url=fake.anthropic_base_url)
        # The fake serves /v1/models; a base URL without /v1 asks /models, which it lacks.
        compatible = OpenAIProvider(api_key=RIGHT, model="m", base_url=fake.base_url)
        try:
            check = ProviderCheck([Checked(anthropic), Checked(compatible, fallback=True)],
                                  offline_ok=False)
            assert await check.run() == []
        finally:
            await anthropic.aclose()
            await compatible.aclose()
    assert fake.model_listings == [("anthropic", 200)]
    assert check.health() == {"ok": True, "last_error": None}
    assert "GATEWAY_FALLBACKS: openai answered the credential check with an error (openai: " \
           "HTTP 404" in caplog.text


def test_offline_provider_is_not_checked(here: Path) -> None:
    """The offline provider makes no request, so there is nothing to check."""
    settings = Settings(_env_file=None, GATEWAY_PROVIDER="offline")  # type: ignore[call-arg]
    from app.compose_providers import build_provider

    assert providers_to_check(build_provider(settings), []) == []


async def test_offline_ok_starts_degraded_until_the_key_works(here: Path) -> None:
    """With GATEWAY_START_OFFLINE_OK the gateway starts though the key is refused; /healthz
    answers 503 with the reason (never a null last_error) until a later check passes, then
    200."""
    async with FakeProviderServer(api_key="sk-ant-not-yet-valid-000000") as fake:
        settings = _settings(here, fake, GATEWAY_START_OFFLINE_OK="true")
        fallbacks = build_fallbacks(settings)
        gateway = build_gateway(settings, fallbacks=fallbacks)
        check = check_at_start(gateway, fallbacks, offline_ok=settings.start_offline_ok)
        check.recheck = 0.05
        await gateway.start()
        try:
            url = f"http://127.0.0.1:{gateway.bound_port}/healthz"
            async with aiohttp.ClientSession() as http:
                async with http.get(url) as resp:
                    degraded = (resp.status, await resp.json())
                assert degraded[0] == 503
                part = degraded[1]["provider_check"]
                assert part["ok"] is False
                assert part["last_error"].startswith("ANTHROPIC_API_KEY was refused (anthropic: "
                                                     "HTTP 401")
                fake.api_key = RIGHT  # the key starts working (a key rotated at the provider)
                await eventually(lambda: check.health()["ok"] is True)
                async with http.get(url) as resp:
                    assert resp.status == 200
                    assert (await resp.json())["provider_check"] == {"ok": True,
                                                                     "last_error": None}
        finally:
            await gateway.aclose()


class _ClosingFallback(OfflineProvider):
    """A fallback that says whether the gateway closed it."""

    closed = False

    async def aclose(self) -> None:
        self.closed = True


async def test_a_refused_start_closes_the_fallbacks_it_never_reached(here: Path) -> None:
    """A start stopped by the check (the configured key is refused) still closes each fallback
    provider, though the start never reached its place: their HTTP clients were open since
    they were built."""
    async with FakeProviderServer(api_key=RIGHT) as fake:
        settings = _settings(here, fake, ANTHROPIC_API_KEY=WRONG)
        fallback = _ClosingFallback()
        gateway = build_gateway(settings, fallbacks=[fallback])
        check_at_start(gateway, [fallback], offline_ok=False)
        with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY was refused"):
            await gateway.start()
    assert fallback.closed
