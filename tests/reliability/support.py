"""Helpers shared by the reliability tests and ``bench/bench_load.py``: settings, a started
gateway with an HTTP client, metric reads, polling, and file-tree snapshots."""

from __future__ import annotations

import asyncio
import gc
import time
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import orjson
import psutil
from prometheus_client.parser import text_string_to_metric_families

from app.compose import build_gateway
from app.config import Settings
from app.server import Gateway
from gateway.edge.coordination import Coordinator
from gateway.edge.provider import Provider, ProviderRequest, ProviderResponse, TextSink
from sessions.store import SessionStore
from tests.fakes.scripted_provider import ScriptedProvider
from tests.waiting import WAIT, until

wait_until = until  # polled waits: see tests/waiting.py


def web_settings(data_dir: Path, **extra: Any) -> Settings:
    """A web-only gateway on 127.0.0.1, port 0, no ``.env`` (keys are variable names)."""
    values: dict[str, Any] = {
        "GATEWAY_DATA_DIR": str(data_dir), "GATEWAY_HOST": "127.0.0.1", "GATEWAY_PORT": 0,
        "GATEWAY_CHANNELS": "web", "GATEWAY_PROVIDER": "offline", "GATEWAY_WEB_TOKEN": None,
        "GATEWAY_SHUTDOWN_GRACE": 0.5,
    }
    values.update(extra)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]  # pydantic-settings init


@dataclass
class WebGateway:
    """A started gateway and a client session for its web API."""

    gateway: Gateway
    http: aiohttp.ClientSession

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.gateway.bound_port}"

    async def chat(self, conversation: str, text: str) -> tuple[int, dict[str, Any]]:
        async with self.http.post(self.base + "/api/chat",
                                  json={"conversation": conversation, "text": text}) as resp:
            return resp.status, await resp.json(loads=orjson.loads)

    async def get_text(self, path: str) -> tuple[int, str]:
        async with self.http.get(self.base + path) as resp:
            return resp.status, await resp.text()

    async def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """``/metrics`` as served, parsed: (sample name, labels) -> value."""
        status, text = await self.get_text("/metrics")
        assert status == 200
        return {(s.name, frozenset(s.labels.items())): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}


    async def metrics_once(self, name: str, at_least: float, timeout: float = WAIT,  # noqa: ASYNC109
                           **labels: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """``/metrics`` once ``name`` (with ``labels``) reaches ``at_least``: a turn is counted
        just after its answer has gone out, so a read right after the answer can be early."""
        found: list[dict[tuple[str, frozenset[tuple[str, str]]], float]] = []

        async def reached() -> bool:
            samples = await self.metrics()
            found.append(samples)
            return total(samples, name, **labels) >= at_least

        await until(reached, timeout, f"{name} to reach {at_least}")
        return found[-1]


def total(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


@asynccontextmanager
async def web_gateway(
    settings: Settings,
    *,
    provider: Provider | None = None,
    store: SessionStore | None = None,
    connections: int = 100,
    coordinator: Coordinator | None = None,
) -> AsyncIterator[WebGateway]:
    """Start a gateway from ``settings``; close it after. The provider is ``provider``, else
    the one the settings name, else (for ``offline``) the instant scripted provider."""
    if provider is None and settings.provider == "offline":
        provider = ScriptedProvider(keep_bodies=False)
    gateway = build_gateway(settings, provider=provider, store=store, coordinator=coordinator)
    await gateway.start()
    try:
        connector = aiohttp.TCPConnector(limit=connections)
        async with aiohttp.ClientSession(connector=connector) as http:
            yield WebGateway(gateway, http)
    finally:
        await gateway.aclose()




def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative path -> bytes): the before/after of "nothing written"."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def session_files(root: Path) -> list[Path]:
    """Session logs only (the owed journal under state/ is JSONL too)."""
    return sorted(root.rglob("sessions/*.jsonl"))


# -- load ----------------------------------------------------------------------------------------


class EchoProvider(ScriptedProvider):
    """The instant scripted provider, answering ``echo: <last user text>`` so that every reply
    names the message it answers (order and loss become checkable)."""

    def __init__(self) -> None:
        super().__init__(keep_bodies=False)

    async def complete(self, request: ProviderRequest,
                       on_text: TextSink | None = None) -> ProviderResponse:
        last = request.messages[-1]["content"] if request.messages else ""
        text = f"echo: {last if isinstance(last, str) else '?'}"
        return ProviderResponse(
            message={"role": "assistant", "content": [{"type": "text", "text": text}]},
            stop_reason="end_turn", usage={"input_tokens": 1, "output_tokens": 1},
        )


@dataclass
class LoadResult:
    """What a load run saw from the client side."""

    seconds: float
    latencies: list[float]
    replies: dict[str, list[tuple[int, str]]]
    sessions: dict[str, str | None]

    @property
    def messages(self) -> int:
        return len(self.latencies)


def message_text(conversation: str, n: int) -> str:
    return f"{conversation} says {n}"


class Chatter(Protocol):
    """Anything that answers ``POST /api/chat``: the gateway, or a benchmark's bare floor."""

    async def chat(self, conversation: str, text: str) -> tuple[int, dict[str, Any]]: ...


async def run_load(web: Chatter, conversations: int, messages: int,
                   prefix: str = "conv", in_flight: int = 100) -> LoadResult:
    """``conversations`` concurrent conversations, each sending ``messages`` one after the
    other, at most ``in_flight`` requests at a time (a FIFO semaphore: the client's connection
    pool alone is not fair). Latency is timed from when a request may go out."""
    latencies: list[float] = []
    replies: dict[str, list[tuple[int, str]]] = {}
    sessions: dict[str, str | None] = {}
    slots = asyncio.Semaphore(in_flight)

    async def one(conversation: str) -> None:
        got = replies.setdefault(conversation, [])
        for n in range(messages):
            async with slots:
                started = time.perf_counter()
                status, body = await web.chat(conversation, message_text(conversation, n))
                latencies.append(time.perf_counter() - started)
            got.append((status, str(body.get("reply", body.get("error")))))
            sessions[conversation] = body.get("session")

    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for c in range(conversations):
            group.create_task(one(f"{prefix}-{c:05d}"))
    return LoadResult(time.perf_counter() - started, latencies, replies, sessions)


async def settle(web: WebGateway, turns: float, timeout: float = WAIT) -> None:  # noqa: ASYNC109
    """Wait until ``turns`` turns are counted and no conversation has a worker task."""
    gateway = web.gateway

    def done() -> bool:
        counted = sum(s.value for f in gateway.metrics.registry.collect() for s in f.samples
                      if s.name == "gateway_turns_total")
        return counted >= turns and gateway.router.serving == 0 and gateway.router.queued == 0

    await wait_until(done, timeout)


@dataclass(frozen=True)
class IdleMemory:
    """Bytes per idle conversation: traced Python allocations and the process's RSS."""

    traced: float
    rss: float


async def idle_memory_per_conversation(data_dir: Path, count: int, *, keep_open: bool,
                                       warm_up: int = 50) -> IdleMemory:
    """Memory an idle conversation costs once its turn is over, measured over ``count`` new
    conversations of one message each: open-idle (the registry keeps every session open) or
    closed-idle (a registry of one open session: all but the last are closed and released).

    RSS is measured on one pass and tracemalloc on a second (tracing inflates RSS)."""
    out = []
    for traced_pass in (False, True):
        directory = data_dir / ("traced" if traced_pass else "rss")
        settings = web_settings(directory, GATEWAY_DURABILITY="none",
                                GATEWAY_MAX_OPEN_SESSIONS=count + warm_up + 10 if keep_open else 1)
        async with web_gateway(settings, provider=EchoProvider(), connections=20) as web:
            # Warm up the code paths, pools and caches so they are not charged per conversation.
            await run_load(web, warm_up, 1, prefix="warm")
            await settle(web, warm_up)
            gc.collect()
            if traced_pass:
                tracemalloc.start()
                before = tracemalloc.get_traced_memory()[0]
            else:
                before = psutil.Process().memory_info().rss
            await run_load(web, count - 1, 1, prefix="idle")
            # One last conversation alone: its get() evicts whatever was busy before.
            await web.chat("idle-last", "hello")
            await settle(web, warm_up + count)
            gc.collect()
            if traced_pass:
                after = tracemalloc.get_traced_memory()[0]
                tracemalloc.stop()
            else:
                after = psutil.Process().memory_info().rss
            assert len(web.gateway.registry) == (warm_up + count if keep_open else 1)
        out.append((after - before) / count)
    return IdleMemory(traced=out[1], rss=out[0])
