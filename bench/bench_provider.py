"""Benchmark: the provider call itself, and prompt caching over a real conversation.

(a) CPU per provider call, four ways of making the same call against a local fake provider
    server (``tests/fakes/providers.py``, in a subprocess so its CPU is not counted):
    ``create()`` (the SDK's typed method, as the gateway used to call it: every message of
    every request re-validated against the SDK's TypedDicts), ``post bytes`` (the body
    ``sessions.shapes`` encodes, through the client's low-level ``post`` on its default HTTP
    stack), ``post bytes, aiohttp`` (the same on the SDK's aiohttp transport: what the
    gateway ships) and ``post bytes, aiohttp, SDK stream`` (the shipped provider reading the
    answer with the SDK's own ``AsyncStream`` class instead of the gateway's, as before issue
    15's stream change). Streaming answers, an 8 KB system prompt, conversations of 1, 21 and
    101 messages, OpenAI and Anthropic. Process CPU time per call, median of rounds; ways
    alternate within each round.

(b) Prompt caching: a 30-turn conversation through the whole gateway (web channel, agent loop,
    JSONL store) with an 8 KB stable persona (``SOUL.md``) and the Anthropic SDK against the
    fake, which counts cached prefixes as the real API does. Reported: the share of input
    tokens read from the cache over calls 2..30 (target >= 80 %), from the outcomes the
    gateway recorded.

(c) Compaction: a 500-message conversation (250 turns) through the whole gateway with a
    2,000-token window and the Anthropic SDK against the fake. Reported: the compaction calls,
    the largest call (estimated tokens sent, summary included) against the window, and how many
    of the requests the fake received are byte-equal to their replay (target: all).

Run: .venv/bin/python bench/bench_provider.py [--rounds 5] [--calls 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._harness import machine_line, write_report

SIZES = (1, 21, 101)
SYSTEM = ("You are Lisa, a careful assistant who answers briefly and kindly. " * 120)[:8192]
FAKE = """
import asyncio, sys
sys.path.insert(0, {root!r})
from tests.fakes.providers import FakeProviderServer
async def main():
    async with FakeProviderServer() as server:
        print(server.port, flush=True)
        while True:
            server.requests.clear()  # the fake keeps what it got: keep it small
            await asyncio.sleep(0.5)
asyncio.run(main())
"""
CACHE_TURNS = 30
CACHE_TARGET = 0.80
LONG_TURNS = 250
LONG_WINDOW = 2000


def conversation(size: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"question {i}: how do I set up the gateway?"}
            if i % 2 == 0 else
            {"role": "assistant", "content": [{"type": "text", "text": f"answer {i}: like so."}]}
            for i in range(size)]


Call = Callable[[], Awaitable[None]]


async def ways(api: str, base_url: str, size: int) -> tuple[dict[str, Call], Callable[[], Any]]:
    """The three ways of making one call of ``size`` messages, and their cleanup."""
    import anthropic
    import openai

    from gateway.edge.provider import ProviderRequest
    from providers.anthropic import AnthropicProvider
    from providers.openai import OpenAIProvider
    from sessions.shapes import request_body

    messages = conversation(size)

    async def sink(text: str) -> None:
        return None

    shipped: Any
    if api == "openai":
        shipped_args: tuple[str, ...] = ("bench", "gpt-4o-mini", f"{base_url}/v1")
        shipped = OpenAIProvider(*shipped_args)
        sdk: Any = openai.AsyncOpenAI(api_key="bench", base_url=f"{base_url}/v1")
        plain = OpenAIProvider("bench", "gpt-4o-mini", base_url=f"{base_url}/v1")
        plain._client = openai.AsyncOpenAI(api_key="bench", base_url=f"{base_url}/v1")
        body = request_body("openai", SYSTEM, messages, (), "gpt-4o-mini", shipped.params())

        async def create() -> None:
            stream = await sdk.chat.completions.create(**body)
            async for _ in stream:
                pass
    else:
        shipped_args = ("bench", "claude-sonnet-4-5", base_url)
        shipped = AnthropicProvider(*shipped_args)
        sdk = anthropic.AsyncAnthropic(api_key="bench", base_url=base_url)
        plain = AnthropicProvider("bench", "claude-sonnet-4-5", base_url=base_url)
        plain._client = anthropic.AsyncAnthropic(api_key="bench", base_url=base_url)
        body = request_body("anthropic", SYSTEM, messages, (), "claude-sonnet-4-5",
                            shipped.params())

        async def create() -> None:
            stream = await sdk.messages.create(**body)
            async for _ in stream:
                pass

    request = ProviderRequest(SYSTEM, messages, (), shipped.model, shipped.params())
    sdk_stream = _sdk_stream_providers()[api](*shipped_args)

    async def post_plain() -> None:
        await plain.complete(request, sink)

    async def post_shipped() -> None:
        await shipped.complete(request, sink)

    async def post_sdk_stream() -> None:
        await sdk_stream.complete(request, sink)

    async def close() -> None:
        await shipped.aclose()
        await plain.aclose()
        await sdk_stream.aclose()
        await sdk.close()

    return ({"create()": create, "post bytes": post_plain,
             "post bytes, aiohttp, SDK stream": post_sdk_stream,
             "post bytes, aiohttp (shipped)": post_shipped}, close)


def _sdk_stream_providers() -> dict[str, Any]:
    """The shipped providers, reading streamed answers with the SDKs' own stream class."""
    import anthropic
    import openai

    from providers.anthropic import AnthropicProvider
    from providers.openai import OpenAIProvider

    class OpenAISdkStream(OpenAIProvider):
        async def _post(self, body: bytes, stream: bool) -> Any:
            return await self._client.post(
                "/chat/completions", content=body, cast_to=object, stream=stream,
                stream_cls=openai.AsyncStream[object],
                options={"security": {"bearer_auth": True}})

    class AnthropicSdkStream(AnthropicProvider):
        async def _post(self, body: bytes, stream: bool) -> Any:
            return await self._client.post(
                "/v1/messages", content=body, cast_to=object, stream=stream,
                stream_cls=anthropic.AsyncStream[object])

    return {"openai": OpenAISdkStream, "anthropic": AnthropicSdkStream}


ROOT = str(Path(__file__).resolve().parents[1])


async def per_call(rounds: int, calls: int) -> list[str]:
    fake = await asyncio.create_subprocess_exec(
        sys.executable, "-c", FAKE.format(root=ROOT), stdout=subprocess.PIPE)
    try:
        assert fake.stdout is not None
        base_url = f"http://127.0.0.1:{int(await fake.stdout.readline())}"
        results: dict[tuple[str, int, str], list[float]] = {}
        for api in ("openai", "anthropic"):
            for size in SIZES:
                table, close = await ways(api, base_url, size)
                try:
                    for fn in table.values():  # warm-up: connections, imports, caches
                        for _ in range(10):
                            await fn()
                    for r in range(rounds):
                        order = list(table.items())
                        for name, fn in order if r % 2 == 0 else reversed(order):
                            started = time.process_time()
                            for _ in range(calls):
                                await fn()
                            spent = (time.process_time() - started) / calls * 1000
                            results.setdefault((api, size, name), []).append(spent)
                finally:
                    await close()
                print(f"(a) {api} {size} messages done", file=sys.stderr)
    finally:
        fake.terminate()
        await fake.wait()
    lines = ["| API | messages | way | CPU ms per call (median; range) | vs create() |",
             "|---|---|---|---|---|"]
    for (api, size, name), values in results.items():
        base = statistics.median(results[api, size, "create()"])
        mid = statistics.median(values)
        lines.append(f"| {api} | {size} | {name} | {mid:.2f} ({min(values):.2f}-"
                     f"{max(values):.2f}) | {mid / base:.2f}x |")
    return lines


async def caching() -> list[str]:
    import aiohttp
    import orjson

    from app.compose import build_gateway
    from app.config import Settings
    from providers.anthropic import AnthropicProvider
    from tests.fakes.providers import FakeProviderServer

    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp:
        data = Path(tmp) / "data"
        persona = Path(tmp) / "persona"
        persona.mkdir()
        (persona / "SOUL.md").write_text(SYSTEM)
        async with FakeProviderServer() as srv:
            provider = AnthropicProvider("bench", "claude-sonnet-4-5",
                                         base_url=srv.anthropic_base_url, max_retries=0)
            settings = Settings(_env_file=None, GATEWAY_DATA_DIR=str(data), GATEWAY_PORT=0,
                                GATEWAY_PERSONA_DIR=str(persona))
            gateway = build_gateway(settings, provider=provider)
            await gateway.start()
            try:
                url = f"http://127.0.0.1:{gateway.bound_port}/api/chat"
                async with aiohttp.ClientSession() as http:
                    for turn in range(CACHE_TURNS):
                        async with http.post(url, json={
                                "conversation": "cache", "text": f"turn {turn}: tell me more "
                                "about how caching works in this gateway, please."}) as resp:
                            assert resp.status == 200, await resp.text()
            finally:
                await gateway.aclose()
        [log] = list(data.rglob("sessions/*.jsonl"))  # (the web chat's own tenant)
        outcomes = [e for e in map(orjson.loads, log.read_bytes().splitlines())
                    if e["type"] == "outcome"]
    usage = [o["usage"] for o in outcomes]
    assert len(usage) == CACHE_TURNS, len(usage)

    def inputs(u: dict[str, int]) -> int:
        return (u.get("input_tokens", 0) + u.get("cache_read_input_tokens", 0)
                + u.get("cache_creation_input_tokens", 0))

    later = usage[1:]
    read = sum(u.get("cache_read_input_tokens", 0) for u in later)
    total = sum(inputs(u) for u in later)
    share = read / total
    verdict = "**pass**" if share >= CACHE_TARGET else "**miss**"
    return [
        "| measure | value | target | result |", "|---|---|---|---|",
        f"| calls | {len(usage)} | | |",
        f"| input tokens of call 1 (written to the cache) | {inputs(usage[0]):,} "
        f"({usage[0].get('cache_creation_input_tokens', 0):,}) | | |",
        f"| input tokens of calls 2-{CACHE_TURNS} | {total:,} | | |",
        f"| ... read from the cache | {read:,} | | |",
        f"| share read from the cache | **{share:.1%}** | >= {CACHE_TARGET:.0%} | {verdict} |",
        f"| input tokens of the last call (uncached / written / read) | "
        f"{later[-1].get('input_tokens', 0):,} / "
        f"{later[-1].get('cache_creation_input_tokens', 0):,} / "
        f"{later[-1].get('cache_read_input_tokens', 0):,} | | |",
    ]


async def compaction() -> list[str]:
    import aiohttp

    from app.compose import build_gateway
    from app.config import Settings
    from gateway.agent.window import estimate_tokens
    from providers.anthropic import AnthropicProvider
    from sessions.replay import replay_bytes
    from sessions.shapes import encode_body
    from tests.fakes.providers import FakeProviderServer

    with tempfile.TemporaryDirectory(prefix="bench-compaction-") as tmp:
        data = Path(tmp) / "data"
        async with FakeProviderServer() as srv:
            provider = AnthropicProvider("bench", "claude-sonnet-4-5",
                                         base_url=srv.anthropic_base_url, max_retries=0)
            settings = Settings(_env_file=None, GATEWAY_DATA_DIR=str(data), GATEWAY_PORT=0,
                                GATEWAY_WINDOW_TOKENS=LONG_WINDOW)
            gateway = build_gateway(settings, provider=provider)
            await gateway.start()
            try:
                url = f"http://127.0.0.1:{gateway.bound_port}/api/chat"
                async with aiohttp.ClientSession() as http:
                    for turn in range(LONG_TURNS):
                        async with http.post(url, json={
                                "conversation": "long", "text": f"turn {turn}: here is what "
                                "happened next in my day, in some detail. " * 3}) as resp:
                            assert resp.status == 200, await resp.text()
            finally:
                await gateway.aclose()
            received = [r.raw for r in srv.requests]
        [log] = list(data.rglob("sessions/*.jsonl"))  # (the web chat's own tenant)
        replay = replay_bytes(log.read_bytes())
    equal = sum(encode_body(replay.request(t)) == raw
                for t, raw in zip(replay.calls, received, strict=True))
    summaries = [t for t in replay.calls if t.lineage and t.lineage.reason == "compaction"]
    ordinary = [t for t in replay.calls if t not in summaries]
    largest = max(sum(estimate_tokens(m) for m in replay.sent(t)) for t in ordinary)
    verdict = "**pass**" if equal == len(received) and largest <= LONG_WINDOW else "**miss**"
    return [
        "| measure | value | target | result |", "|---|---|---|---|",
        f"| messages in the conversation | {len(replay.messages)} | | |",
        f"| provider calls (compaction calls) | {len(replay.calls)} ({len(summaries)}) | | |",
        f"| largest call, estimated tokens sent (summary included) | {largest:,} | "
        f"<= {LONG_WINDOW:,} (the window) | |",
        f"| requests byte-equal to their replay | {equal} of {len(received)} | all | "
        f"{verdict} |",
    ]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200, help="calls per way per round")
    args = parser.parse_args()
    started = time.perf_counter()
    load_before = os.getloadavg()
    cache_lines = await caching()
    long_lines = await compaction()
    call_lines = await per_call(args.rounds, args.calls)
    report = "\n".join([
        "## Provider calls and prompt caching", "",
        f"`.venv/bin/python bench/bench_provider.py --rounds {args.rounds} --calls {args.calls}`"
        f" ({time.perf_counter() - started:.0f} s)", "",
        machine_line(load_before), "",
        "### (a) CPU per provider call (streamed answer, 8 KB system prompt)", "",
        *call_lines, "",
        f"### (b) Prompt caching: {CACHE_TURNS}-turn conversation, 8 KB stable persona, "
        "Anthropic SDK against the caching fake", "",
        *cache_lines, "",
        f"### (c) Compaction: a {2 * LONG_TURNS}-message conversation, "
        f"{LONG_WINDOW:,}-token window, Anthropic SDK against the fake", "",
        *long_lines, "",
    ])
    print(report)
    write_report("provider.md", report)


if __name__ == "__main__":
    asyncio.run(main())
