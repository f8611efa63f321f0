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
``gateway/raw-http``
    the shipped provider's body, answer parsing and stream reading, but posted with a bare
    aiohttp session instead of through the SDK client (no SDK request path: no per-call
    options model, URL and header building, retries, typed errors). Not a product setting: it
    measures what the issue's "through the SDK's low-level request method" costs.

Only the standard library is imported at module level: the subjects' children import this
module, and it must not add to their RSS.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

PROVIDER_VARIANTS = (
    ("gateway/anthropic", "gateway with the Anthropic SDK (cache breakpoints) instead of OpenAI's"),
    ("gateway/scripted", "gateway with the in-process ScriptedProvider (no SDK, no HTTP)"),
    ("gateway/fsync-off", "gateway with GATEWAY_DURABILITY=none (no fsync at a turn's end)"),
    ("gateway/raw-http", "gateway posting the same bytes with bare aiohttp (no SDK request path)"),
)
"""Diagnostic rows (``--diagnose``), paired with the gateway as shipped to the benchmark."""
MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-sonnet-4-5"}
PROVIDER_PROFILE_GROUPS = (
    ("provider call: SDK post, SSE stream, answer assembled", "providers/sdk.py",
     "complete"),
    ("... of which the SDK client's request (auth, retries, HTTP)", "openai/_base_client.py",
     "request"),
)
"""Profile rows (label, path suffix, function) of the provider call, for ``--profile``."""


LLM_FLOOR = "echo/llm"
"""The floor of the targets (issue 31): the bare bot answering with one provider call."""


class LlmReplies:
    """What the ``echo/llm`` floor does per message: the least an LLM bot does. One streamed
    ``chat.completions.create`` through the real openai SDK (its typed request path, on its
    aiohttp transport, as the gateway's client) against the driver's fake provider, the text
    joined. No history, no log, no journal, no fsync. Imported in that child only."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        import openai

        self._client = openai.AsyncOpenAI(api_key="bench-key",
                                          base_url=f"{cfg['provider_base_url']}/v1",
                                          http_client=openai.DefaultAioHttpClient())

    async def reply(self, text: str) -> str:
        stream = await self._client.chat.completions.create(
            model=MODELS["openai"], messages=[{"role": "user", "content": text}], stream=True,
            stream_options={"include_usage": True})
        parts = []
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
        return "".join(parts)

    async def aclose(self) -> None:
        await self._client.close()


async def platform_sections(args: Any, name: str, scenarios: Sequence[Any], targets: Any,
                            variants: Sequence[tuple[str, str]],
                            profile_groups: Sequence[tuple[str, str, str]], one: Any,
                            profiled: Any) -> list[str]:
    """The optional sections of the Telegram and Slack reports, in order: ``--diagnose`` (the
    gateway against ``variants``) and ``--profile`` (``profiled(scenario, path)`` runs the
    gateway once under cProfile). ``name`` names the report files. (The second floor,
    ``echo/llm``, is measured in the main rounds.)"""
    import tempfile
    from pathlib import Path

    from bench._harness import alternate, profile_shares, top_functions, variant_table, write_report

    lines: list[str] = []
    if args.diagnose:
        variant_runs = await alternate(args.diagnose, scenarios,
                                       ["gateway", *(v for v, _ in variants)], one)
        lines += [f"### Where the time goes: gateway variants ({args.diagnose} rounds, "
                  "paired with the gateway as shipped; diagnostics, not product settings)", "",
                  *variant_table(variant_runs, scenarios, "gateway", variants), ""]
    if args.profile:
        with tempfile.TemporaryDirectory(prefix=f"bench-{name}-prof-") as tmp:
            for scenario in scenarios:
                path = str(Path(tmp) / f"{scenario.name}.prof")
                run = await profiled(scenario, path)
                out = write_report(f"{name}-profile-{scenario.name}.txt", top_functions(path))
                lines += [f"Profile of the gateway in ({scenario.name}): cProfile on the event "
                          f"loop thread's CPU clock ({run.cpu_ms:.1f} CPU ms/message with the "
                          f"profiler on, so shares, not times); top functions in `{out}`.", "",
                          *profile_shares(path, profile_groups), ""]
    return lines


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
    """The provider object to inject (the scripted and raw-http variants), else None: the
    settings decide."""
    variant = cfg.get("variant", "")
    if variant == "raw-http":
        return raw_http_provider(f"{cfg['provider_base_url']}/v1")
    if provider_of(variant) != "scripted":
        return None
    from tests.fakes.scripted_provider import ScriptedProvider

    return ScriptedProvider(keep_bodies=False)


def raw_http_provider(base_url: str) -> Any:
    """The ``gateway/raw-http`` diagnostic: :class:`~providers.openai.OpenAIProvider`
    with its ``_post`` replaced by a bare aiohttp POST of the same bytes (see the module
    docstring). Imported in the child only, when that variant runs."""
    import aiohttp
    import orjson

    from providers.openai import OpenAIProvider

    class RawStream:
        """The response's SSE ``data:`` lines as JSON objects, until ``[DONE]``."""

        def __init__(self, response: aiohttp.ClientResponse) -> None:
            self.response = response

        async def __aenter__(self) -> RawStream:
            return self

        async def __aexit__(self, *exc: object) -> None:
            self.response.release()

        async def __aiter__(self) -> AsyncIterator[Any]:
            async for line in self.response.content:
                if line.startswith(b"data: "):
                    data = line[6:].strip()
                    if data == b"[DONE]":
                        return
                    yield orjson.loads(data)

    class RawHttpOpenAI(OpenAIProvider):
        def __init__(self) -> None:
            super().__init__(api_key="bench-key", model=MODELS["openai"], base_url=base_url)
            self._url = f"{base_url}/chat/completions"
            self._headers = {"Content-Type": "application/json",
                             "Authorization": "Bearer bench-key"}
            self._session: aiohttp.ClientSession | None = None

        async def _post(self, body: bytes, stream: bool) -> Any:
            if self._session is None:
                self._session = aiohttp.ClientSession()
            response = await self._session.post(self._url, data=body, headers=self._headers)
            response.raise_for_status()
            if stream:
                return RawStream(response)
            try:
                return await response.json(loads=orjson.loads)
            finally:
                response.release()

        async def _close(self) -> None:
            await super()._close()
            if self._session is not None:
                await self._session.close()

    return RawHttpOpenAI()


@contextlib.asynccontextmanager
async def fake_provider() -> AsyncIterator[Any]:
    """The fake provider server (echoes the last user text), in the driver process."""
    from tests.fakes.providers import FakeProviderServer

    async with FakeProviderServer() as server:
        # As bench/_model_server.py: the SDK's request types are checked by the tests, not
        # here. Validating every body (schema walk of the whole prompt) costs this process,
        # which shares the machine with the subject, time that grows with the conversation's
        # history: a one-message floor paid almost none of it, the gateway ~0.5 ms a message
        # by the 30th of one thread, on the latency the scenario measures.
        server.validate = False
        yield server


def provider_calls(server: Any) -> int:
    """How many requests the fake answered (both APIs)."""
    return len(server.requests)
