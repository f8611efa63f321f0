"""Model-visible ⟺ recorded: through the web channel, with the real Anthropic and OpenAI SDKs
talking to local fake servers, every request body the provider received equals what
``gateway replay ID --request N --shape S`` rebuilds."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, redirect_stdout
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from app.cli import main as cli_main
from app.compose import build_gateway
from app.config import Settings
from app.server import Gateway
from gateway.edge.provider import Provider
from providers.anthropic import AnthropicProvider
from providers.openai import OpenAIProvider
from sessions.otlp import SPAN_KIND_CLIENT
from tests.e2e.replaying import assert_shows_what_was_read, replay_cli, system_read
from tests.fakes.providers import FakeProviderServer, RecordedRequest, Reply

__all__ = ["API", "make_provider", "replay_cli"]  # the other suites' imports from here

API = ["anthropic", "openai"]


def make_provider(api: str, srv: FakeProviderServer) -> Provider:
    if api == "anthropic":
        return AnthropicProvider(api_key="test-key-anthropic", model="claude-test",
                                 base_url=srv.anthropic_base_url, max_retries=0)
    return OpenAIProvider(api_key="test-key-openai", model="gpt-test",
                          base_url=srv.openai_base_url, max_retries=0)


@asynccontextmanager
async def gateway_for(tmp_path: Path, provider: Provider, **env: Any) -> AsyncIterator[Gateway]:
    settings = Settings(_env_file=None, GATEWAY_DATA_DIR=str(tmp_path / "data"),
                        GATEWAY_PORT=0, **env)
    gateway = build_gateway(settings, provider=provider)
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.aclose()


async def chat(gateway: Gateway, conversation: str, text: str,
               expect: int = 200) -> dict[str, Any]:
    url = f"http://127.0.0.1:{gateway.bound_port}/api/chat"
    async with aiohttp.ClientSession() as http, http.post(
        url, json={"conversation": conversation, "text": text}
    ) as response:
        assert response.status == expect, await response.text()
        body: dict[str, Any] = await response.json()
        return body


def system_of(body: dict[str, Any], api: str) -> str:
    """The system prompt the model read (an Anthropic body with a cache breakpoint sends it as
    blocks, read one after the other)."""
    text = system_read(body)
    assert text is not None, f"a {api} body without a system prompt"
    return text


def text_of(content: str | list[dict[str, Any]]) -> str:
    return content if isinstance(content, str) else "".join(b.get("text", "") for b in content)


def assert_every_call_replays(data_dir: Path, session: str, api: str,
                              requests: list[RecordedRequest]) -> None:
    """Every request the fake received is, byte for byte, what replay rebuilds for its call,
    and the system prompt replay shows is the one the model read."""
    assert assert_shows_what_was_read(data_dir, session,
                                      received=[r.body for r in requests]) == len(requests)
    for n, received in enumerate(requests, start=1):
        code, out = replay_cli(data_dir, session, "--request", str(n), "--shape", api, "--raw")
        assert code == 0
        assert out.encode() == received.raw, f"call {n} differs from its replay"


@pytest.mark.parametrize("api", API)
async def test_tool_rewrites_persona_mid_turn_and_every_call_replays(
    tmp_path: Path, api: str
) -> None:
    """A memory_write tool round rebuilds the prompt mid-turn; all calls replay exactly."""
    async with FakeProviderServer() as srv:
        srv.script(api, Reply.text("Hello Ada."),
                   Reply.tool_use("memory_write", {"text": "Ada likes green tea"},
                                  text_before="Saving that."),
                   Reply.text("Noted, green tea it is."))
        async with gateway_for(tmp_path, make_provider(api, srv)) as gateway:
            first = await chat(gateway, "ada", "hi, I'm Ada")
            second = await chat(gateway, "ada", "remember that I like green tea")
        requests = srv.requests_for(api)
    assert first["session"] == second["session"]
    assert second["reply"].endswith("Noted, green tea it is.")
    systems = [system_of(r.body, api) for r in requests]
    assert "Ada likes green tea" not in systems[1]
    assert "Ada likes green tea" in systems[2]  # the very next call, same turn
    await asyncio.to_thread(assert_every_call_replays, tmp_path / "data", first["session"], api,
                            requests)
    _code, summary = await asyncio.to_thread(replay_cli, tmp_path / "data", first["session"])
    assert "rebuilt:memory_write" in summary


@pytest.mark.parametrize("api", API)
async def test_window_drops_old_messages_and_replays(tmp_path: Path, api: str) -> None:
    """With a small token budget the oldest messages leave the window; replay agrees."""
    async with FakeProviderServer() as srv:
        async with gateway_for(tmp_path, make_provider(api, srv),
                               GATEWAY_WINDOW_TOKENS=120) as gateway:
            for i in range(6):
                reply = await chat(gateway, "w", f"message number {i}: " + "lorem ipsum " * 12)
        requests = srv.requests_for(api)
    user_texts = [text_of(m["content"]) for m in requests[-1].body["messages"]
                  if m["role"] == "user"]
    assert not any(t.startswith("message number 0") for t in user_texts)
    await asyncio.to_thread(assert_every_call_replays, tmp_path / "data", reply["session"], api,
                            requests)


@pytest.mark.parametrize("api", API)
async def test_endpoint_recorded_beside_the_body_and_exported(tmp_path: Path, api: str) -> None:
    """Each call entry records the endpoint the SDK posted to (its origin); the request still
    replays byte for byte, and the otlp-json export names it as server.address/server.port."""
    async with FakeProviderServer() as srv:
        async with gateway_for(tmp_path, make_provider(api, srv)) as gateway:
            reply = await chat(gateway, "x", "hello")
        requests = srv.requests_for(api)
        port = srv.port
    data = tmp_path / "data"
    await asyncio.to_thread(assert_every_call_replays, data, reply["session"], api, requests)
    (log,) = data.rglob(f"{reply['session']}.jsonl")
    calls = [e for e in map(orjson.loads, log.read_bytes().splitlines()) if e["type"] == "call"]
    assert [c["endpoint"] for c in calls] == [f"http://127.0.0.1:{port}"] * len(requests)
    out = io.StringIO()
    with redirect_stdout(out):
        code = await asyncio.to_thread(cli_main, ["export", "--data-dir", str(data),
                                                  reply["session"], "--format", "otlp-json"])
    assert code == 0
    spans = [span for line in out.getvalue().splitlines()
             for resource in orjson.loads(line)["resourceSpans"]
             for scope in resource["scopeSpans"] for span in scope["spans"]
             if span["kind"] == SPAN_KIND_CLIENT]  # the calls (not their turn's span)
    servers = [{a["key"]: a["value"] for a in span["attributes"]
                if a["key"].startswith("server.")} for span in spans]
    assert servers == [{"server.address": {"stringValue": "127.0.0.1"},
                        "server.port": {"intValue": str(port)}}] * len(requests)


@pytest.mark.parametrize("api", API)
async def test_endpoint_in_replay_json_and_the_jsonl_export(tmp_path: Path, api: str) -> None:
    """The endpoint a call entry records is in `gateway replay --json` (every turn), in
    `--call N --json` and in each record of `gateway export --format jsonl`."""
    async with FakeProviderServer() as srv:
        async with gateway_for(tmp_path, make_provider(api, srv)) as gateway:
            reply = await chat(gateway, "x", "hello")
        calls = len(srv.requests_for(api))
        endpoint = f"http://127.0.0.1:{srv.port}"
    data = tmp_path / "data"
    code, whole = await asyncio.to_thread(replay_cli, data, reply["session"], "--json")
    assert code == 0
    code, one = await asyncio.to_thread(replay_cli, data, reply["session"], "--call", "1",
                                        "--json")
    assert code == 0
    out = io.StringIO()
    with redirect_stdout(out):
        code = await asyncio.to_thread(cli_main, ["export", "--data-dir", str(data),
                                                  reply["session"], "--format", "jsonl"])
    assert code == 0
    exported = [orjson.loads(line) for line in out.getvalue().splitlines()]
    assert [t["endpoint"] for t in orjson.loads(whole)["calls"]] == [endpoint] * calls
    assert orjson.loads(one)["endpoint"] == endpoint
    assert [r["endpoint"] for r in exported] == [endpoint] * calls


async def test_provider_error_apology_recorded_and_replayed(tmp_path: Path) -> None:
    """A 529 ends the turn with an apology; replay shows the call and its error outcome."""
    async with FakeProviderServer() as srv:
        srv.script("anthropic", Reply.error(529))
        async with gateway_for(tmp_path, make_provider("anthropic", srv)) as gateway:
            reply = await chat(gateway, "e", "hello?", expect=502)
        requests = srv.requests_for("anthropic")
    assert reply["error"].startswith("Sorry")
    await asyncio.to_thread(assert_every_call_replays, tmp_path / "data", reply["session"],
                            "anthropic", requests)
    _code, turn = await asyncio.to_thread(replay_cli, tmp_path / "data", reply["session"],
                                         "--turn", "1", "--json")
    assert orjson.loads(turn)["outcome"]["error"]["kind"] == "unavailable"
    assert orjson.loads(turn)["assistant"] is None


async def test_fallback_after_529_every_attempt_replays(tmp_path: Path) -> None:
    """Anthropic answers 529 (after the SDK's retry); GATEWAY_FALLBACKS tries OpenAI, which
    answers. Both requests reached their fakes exactly as replay rebuilds them."""
    async with FakeProviderServer() as srv:
        srv.script("anthropic", Reply.error(529), Reply.error(529))
        settings = Settings(
            _env_file=None, GATEWAY_DATA_DIR=str(tmp_path / "data"), GATEWAY_PORT=0,
            GATEWAY_PROVIDER="anthropic", ANTHROPIC_API_KEY="test-key-anthropic",
            ANTHROPIC_BASE_URL=srv.anthropic_base_url, GATEWAY_MODEL="claude-test",
            GATEWAY_PROVIDER_RETRIES=1, OPENAI_API_KEY="test-key-openai",
            OPENAI_BASE_URL=srv.openai_base_url, GATEWAY_FALLBACKS="openai:gpt-test")
        gateway = build_gateway(settings)
        await gateway.start()
        try:
            reply = await chat(gateway, "f", "are you there?")
        finally:
            await gateway.aclose()
        anthropic_requests = srv.requests_for("anthropic")
        openai_requests = srv.requests_for("openai")
    assert reply["reply"] == "echo: are you there?"
    assert len(anthropic_requests) == 2  # the SDK's own retry first
    assert anthropic_requests[0].raw == anthropic_requests[1].raw
    data = tmp_path / "data"
    for n, (received, shape) in enumerate([(anthropic_requests[0], "anthropic"),
                                           (openai_requests[0], "openai")], start=1):
        code, out = await asyncio.to_thread(replay_cli, data, reply["session"], "--request",
                                            str(n), "--shape", shape, "--raw")
        assert code == 0
        assert out.encode() == received.raw
    _code, summary = await asyncio.to_thread(replay_cli, data, reply["session"], "--json")
    calls = orjson.loads(summary)["calls"]
    assert [(c["provider"], c["model"]) for c in calls] == [
        ("anthropic", "claude-test"), ("openai", "gpt-test")]
    assert await asyncio.to_thread(
        assert_shows_what_was_read, data, reply["session"],
        received=[anthropic_requests[0].body, openai_requests[0].body]) == 2


@pytest.mark.parametrize("api", API)
async def test_compaction_through_the_sdk_replays_exactly(tmp_path: Path, api: str) -> None:
    """A small window: compaction calls through the real SDK; every request (compaction calls
    included) is byte-equal to its replay."""
    async with FakeProviderServer() as srv:
        async with gateway_for(tmp_path, make_provider(api, srv),
                               GATEWAY_WINDOW_TOKENS=300) as gateway:
            for i in range(10):
                reply = await chat(gateway, "long", f"message {i}: " + "lorem ipsum " * 20)
        requests = srv.requests_for(api)
    systems = [system_of(r.body, api) for r in requests]
    assert any(s.startswith("You keep the memory of a long conversation") for s in systems)
    await asyncio.to_thread(assert_every_call_replays, tmp_path / "data", reply["session"], api,
                            requests)
