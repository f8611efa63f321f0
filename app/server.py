"""The running gateway: owns the lifecycle of the server, channels, router and store.

The HTTP server's limits (header and body timeouts, header sizes) and who may read
``/metrics`` are in :mod:`app.server_limits`.

Start order: coordinator (Redis, when workers share one), router, services (the pairing
state's writer; the tool servers, each up or failed once within ``GATEWAY_MCP_START_TIMEOUT``),
HTTP server (``/healthz``, ``/metrics`` and channel routes), channels. Stop
order (SIGINT/SIGTERM or :meth:`Gateway.aclose`): channels stop taking input, in-flight turns
get ``shutdown_grace`` seconds, then are cancelled (a worker hands its queued conversations to
the others); services write what they hold (tool servers stop); sessions are flushed and
closed, then the coordinator, store, provider and server. ``aclose`` is idempotent and closes
everything even if a step fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from aiohttp import web
from prometheus_client.aiohttp import make_aiohttp_handler

from app.http_errors import json_api_errors
from app.server_limits import InternalAccess, application, runner_options
from gateway.delivery.registry import ConversationRegistry
from gateway.delivery.router import Router
from gateway.edge.channel import Channel, Deliver, HttpChannel
from gateway.edge.coordination import Coordinator
from gateway.edge.errors import ConfigError
from gateway.edge.http_limits import DEFAULT_TIMEOUT
from gateway.edge.metrics import Metrics
from gateway.edge.observe import NO_OBSERVER, TurnObserver
from gateway.edge.provider import Provider
from sessions.store import SessionStore

log = logging.getLogger("gateway.app")


class Gateway:
    """All the long-lived parts, wired by :mod:`app.compose`."""

    def __init__(
        self,
        *,
        store: SessionStore,
        provider: Provider,
        router: Router,
        registry: ConversationRegistry,
        channels: Sequence[Channel],
        metrics: Metrics,
        host: str,
        port: int,
        shutdown_grace: float,
        extra_routes: Iterable[web.AbstractRouteDef] = (),
        health_extra: dict[str, Any] | None = None,
        health_parts: Mapping[str, Callable[[], object]] | None = None,
        deliver: Deliver | None = None,
        coordinator: Coordinator,
        observer: TurnObserver = NO_OBSERVER,
        services: Sequence[AbstractAsyncContextManager[object]] = (),
        closing: Sequence[Callable[[], Awaitable[None]]] = (),
        http_timeout: float = DEFAULT_TIMEOUT,
        metrics_token: str | None = None,
    ) -> None:
        self.store = store
        self.provider = provider
        self.router = router
        self.registry = registry
        self.channels = list(channels)
        self.metrics = metrics
        self.host = host
        self.port = port
        self.shutdown_grace = shutdown_grace
        self.extra_routes = list(extra_routes)
        self.health_extra = health_extra or {}
        self.health_parts = dict(health_parts or {})
        """More of the full ``/healthz``, asked at each request (``mcp``: the tool servers)."""
        self.http_timeout = http_timeout
        self.web_app = application(http_timeout, [json_api_errors])
        self._internal = InternalAccess(metrics_token)
        self._closing = list(closing)
        """More things to close after the store (the blob store, the transcription client)."""
        self.deliver: Deliver = deliver or router.deliver
        """What channels hand inbound messages to: the access gate in front of the router."""
        self.coordinator = coordinator
        self.observer = observer
        """Flushed at shutdown, after the last turn ended (its spans are the last ones)."""
        self._exposition = make_aiohttp_handler(metrics.registry)
        self.services = list(services)
        """Entered after the router, left after the channels (e.g. the pairing state's writer)."""
        self._entered: list[AbstractAsyncContextManager[object]] = []
        self._runner: web.AppRunner | None = None
        self._closed = False
        self._stop = asyncio.Event()

    @property
    def bound_port(self) -> int:
        """The real port (useful when ``port`` was 0)."""
        assert self._runner is not None
        for site in self._runner.sites:
            server = getattr(site, "_server", None)
            if server is not None and server.sockets:
                return int(server.sockets[0].getsockname()[1])
        return self.port

    async def start(self) -> None:
        await self.coordinator.__aenter__()
        await self.router.__aenter__()
        for service in self.services:
            await service.__aenter__()
            self._entered.append(service)
        app = self.web_app
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/metrics", self._metrics)
        for channel in self.channels:
            if isinstance(channel, HttpChannel):
                app.router.add_routes(list(channel.routes()))
        app.router.add_routes(self.extra_routes)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     **runner_options(self.http_timeout))
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except OSError as exc:  # the port is taken, the address is not this machine's...
            raise ConfigError(f"cannot listen on {self.host}:{self.port}: "
                              f"{exc.strerror or exc} (GATEWAY_HOST, GATEWAY_PORT)") from exc
        for channel in self.channels:
            await channel.start(self.deliver)
        self.router.channels_started()  # now what is owed from before can be answered
        log.info("gateway listening on http://%s:%d (channels: %s, provider: %s)",
                 self.host, self.bound_port, ", ".join(c.name for c in self.channels),
                 self.provider.name)

    async def _healthz(self, request: web.Request) -> web.Response:
        channels = {c.name: dict(c.health()) for c in self.channels}
        ok = all(v.get("ok", True) for v in channels.values())
        if self._internal.refusal(request) is not None:
            # Open to anyone (a load balancer's probe), so it says only whether we are up.
            return web.json_response({"ok": ok}, status=200 if ok else 503)
        body = {
            "ok": ok,
            "channels": channels,
            "provider": self.provider.name,
            "open_conversations": len(self.registry),
            "queued": self.router.queued,
            "coordination": dict(self.coordinator.health()),
            **self.health_extra,
            **{name: part() for name, part in self.health_parts.items()},
        }
        return web.json_response(body, status=200 if ok else 503)

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        refusal = self._internal.refusal(request)
        if refusal is not None:
            return refusal
        self.metrics.queue_depth.set(self.router.queued)
        # The client library's own exposition: content negotiation (OpenMetrics when the
        # scraper asks), ``name[]`` filters and gzip, all as Prometheus expects them.
        return await self._exposition(request)

    def request_stop(self) -> None:
        self._stop.set()

    async def run_until_stopped(self) -> None:
        """Serve until SIGINT/SIGTERM (or :meth:`request_stop`), then shut down cleanly."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._stop.set)
        try:
            await self.start()
            freeze_heap()
            await self._stop.wait()
            log.info("stopping: finishing in-flight turns (up to %.0f s)", self.shutdown_grace)
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        # The router stops taking input first (channels get RouterClosedError and leave the
        # platform to redeliver), in-flight turns finish and reply through still-open channels,
        # then the channels close.
        await self.router.drain(self.shutdown_grace)
        for channel in self.channels:
            await _quietly(channel.aclose(), f"channel {channel.name}")
        while self._entered:
            service = self._entered.pop()
            await _quietly(service.__aexit__(None, None, None), type(service).__name__)
        await _quietly(self.router.__aexit__(None, None, None), "router")
        await _quietly(self.registry.aclose(), "sessions")
        await _quietly(self.coordinator.aclose(), "coordinator")
        for close in self._closing:
            await _quietly(close(), "attachments")
        await _quietly(self.store.aclose(), "store")
        await _quietly(self.provider.aclose(), "provider")
        await _quietly(self.observer.aclose(), "traces")
        if self._runner is not None:
            await _quietly(self._runner.cleanup(), "http server")


async def _quietly(work: Any, what: str) -> None:
    try:
        await work
    except Exception as exc:  # shutdown goes on; one line per failed step
        log.warning("shutdown: %s failed to close (%s)", what, type(exc).__name__)


def freeze_heap() -> None:
    """Move what start-up built out of the cyclic collector's generations (``gc.freeze``).

    Modules, clients, settings and compiled schemas (several hundred thousand objects) live as
    long as the process, yet every full collection walked them all again: one took 126 ms in
    the middle of the Telegram benchmark's closed loop, on the event loop's thread. Frozen,
    they are never scanned; what turns allocate is collected as before. Start-up's own
    garbage is collected first, so none of it is kept forever.
    """
    gc.collect()
    gc.freeze()
