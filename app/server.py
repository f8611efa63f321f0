"""The running gateway: its HTTP server, and one lifespan for every long-lived part.

The HTTP server's limits (header and body timeouts, header sizes) and who may read
``/metrics`` are in :mod:`app.server_limits`.

:meth:`Gateway.lifespan` is one :class:`~contextlib.AsyncExitStack`: the parts the
composition root (:mod:`app.compose`) lists, in start order, are entered one by one (the
coordinator, Redis when workers share one; the router; the pairing state's writer; the tool
servers, each up or failed once within ``GATEWAY_MCP_START_TIMEOUT``; the erasure endpoint),
then the HTTP server (``/healthz``, ``/metrics``, the channels' and the viewer's routes)
starts, then the channels. Leaving it (SIGINT/SIGTERM, :meth:`Gateway.aclose`, or a failed
start) unwinds in reverse: the router stops taking input and in-flight turns get
``shutdown_grace`` seconds, then are cancelled (a worker hands its queued conversations to
the others); the channels close; the parts are left in reverse order (services write what
they hold, tool servers stop, sessions are flushed and closed, then the coordinator, the
blob store and other clients, the store, the provider and the tracer); the HTTP server
stops last. Every step is isolated: one that fails is one warning line, and the rest still
close. ``aclose`` is idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, aclosing
from dataclasses import dataclass
from typing import Any, Protocol

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
from gateway.edge.provider import Provider
from sessions.store import SessionStore

log = logging.getLogger(__name__)


class Closes(Protocol):
    """Something open from the moment it is built, closed by ``aclose``."""

    def aclose(self) -> Awaitable[object]: ...


@dataclass(frozen=True, slots=True)
class Part:
    """A long-lived part of the running gateway (see :func:`opened`, :func:`started`):
    ``context`` is entered at start and left at stop; ``name`` names it in the one warning
    line a failed close gets; ``opened``: it is open since it was built, so it is closed even
    when the gateway never starts."""

    name: str
    context: AbstractAsyncContextManager[object]
    opened: bool = False


def opened(name: str, resource: Closes) -> Part:
    """A part open since it was built (a client, a store): only closed, at its place."""
    return Part(name, aclosing(resource), opened=True)


def started(name: str, context: AbstractAsyncContextManager[object]) -> Part:
    """A part that starts when the gateway does (an async context manager)."""
    return Part(name, context)


class Gateway:
    """The HTTP server and the lifespan of the parts wired by :mod:`app.compose`.

    ``parts`` are in start order (see the module docstring); ``store``, ``provider``,
    ``router``, ``registry`` and ``coordinator`` are among them, named here for the health
    report and the stop, never looked up by the core."""

    def __init__(
        self,
        *,
        store: SessionStore,
        provider: Provider,
        router: Router,
        registry: ConversationRegistry,
        coordinator: Coordinator,
        channels: Sequence[Channel],
        deliver: Deliver,
        metrics: Metrics,
        host: str,
        port: int,
        shutdown_grace: float,
        parts: Sequence[Part] = (),
        extra_routes: Iterable[web.AbstractRouteDef] = (),
        health_extra: dict[str, Any] | None = None,
        health_parts: Mapping[str, Callable[[], object]] | None = None,
        http_timeout: float = DEFAULT_TIMEOUT,
        metrics_token: str | None = None,
    ) -> None:
        self.store = store
        self.provider = provider
        self.router = router
        self.registry = registry
        self.coordinator = coordinator
        self.channels = list(channels)
        self.deliver = deliver
        """What channels hand inbound messages to: the access gate in front of the router."""
        self.metrics = metrics
        self.host = host
        self.port = port
        self.shutdown_grace = shutdown_grace
        self.parts = list(parts)
        self.extra_routes = list(extra_routes)
        self.health_extra = health_extra or {}
        self.health_parts = dict(health_parts or {})
        """More of the full ``/healthz``, asked at each request (``mcp``: the tool servers)."""
        self.http_timeout = http_timeout
        self.web_app = application(http_timeout, [json_api_errors])
        self._internal = InternalAccess(metrics_token)
        self._exposition = make_aiohttp_handler(metrics.registry)
        self._runner: web.AppRunner | None = None
        self._running: AbstractAsyncContextManager[Gateway] | None = None
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

    @contextlib.asynccontextmanager
    async def lifespan(self) -> AsyncIterator[Gateway]:
        """Start everything, serve inside the block, stop everything (module docstring)."""
        if self._closed or self._running is not None:
            raise RuntimeError("a gateway runs once")
        try:
            async with AsyncExitStack() as stack:
                stack.push_async_callback(_quietly, self._stop_http, "http server")
                for at, part in enumerate(self.parts):
                    try:
                        await part.context.__aenter__()
                    except BaseException:
                        # The parts after it were never entered; those open since they were
                        # built (a fallback provider's client) are closed here, before the
                        # ones entered, as a stop would.
                        for later in reversed(self.parts[at + 1:]):
                            if later.opened:
                                await _quietly(later.context.__aexit__, later.name,
                                               None, None, None)
                        raise
                    stack.push_async_callback(_quietly, part.context.__aexit__, part.name,
                                              None, None, None)
                # Left first: the router stops taking input (channels get RouterClosedError
                # and leave the platform to redeliver), in-flight turns finish and reply
                # through still-open channels, then the channels close.
                stack.push_async_callback(self._close_channels)
                stack.push_async_callback(_quietly, self.router.drain, "router",
                                          self.shutdown_grace)
                await self._start_http()
                for channel in self.channels:
                    await channel.start(self.deliver)
                self.router.channels_started()  # now what is owed from before can be answered
                log.info("gateway listening on http://%s:%d (channels: %s, provider: %s)",
                         self.host, self.bound_port, ", ".join(c.name for c in self.channels),
                         self.provider.name)
                yield self
        finally:
            self._closed = True

    async def start(self) -> None:
        """Enter :meth:`lifespan` (a failed start has closed everything when it raises)."""
        running = self.lifespan()
        await running.__aenter__()
        self._running = running

    async def aclose(self) -> None:
        """Leave :meth:`lifespan`; without a start, close the parts open since they were
        built. Idempotent."""
        running, self._running = self._running, None
        if running is not None:
            await running.__aexit__(None, None, None)
            return
        if self._closed:
            return
        self._closed = True
        for part in reversed(self.parts):
            if part.opened:
                await _quietly(part.context.__aexit__, part.name, None, None, None)

    async def _start_http(self) -> None:
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

    async def _stop_http(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _close_channels(self) -> None:
        for channel in self.channels:
            await _quietly(channel.aclose, f"channel {channel.name}")

    async def _healthz(self, request: web.Request) -> web.Response:
        channels = {c.name: dict(c.health()) for c in self.channels}
        parts = {name: part() for name, part in self.health_parts.items()}
        # A part that says "ok": false (the provider check, degraded) is as unhealthy as a
        # channel; the MCP part never is (a tool server that is down costs its tools only).
        ok = (all(v.get("ok", True) for v in channels.values())
              and not any(isinstance(p, dict) and p.get("ok") is False for p in parts.values()))
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
            **parts,
        }
        return web.json_response(body, status=200 if ok else 503)

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        refusal = self._internal.refusal(request)
        if refusal is not None:
            return refusal
        self.metrics.queue_depth.set(self.router.queued)
        self.metrics.turn_limit.set(self.router.turn_limit)
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


async def _quietly(close: Callable[..., Awaitable[object]], what: str, *args: object) -> None:
    try:
        await close(*args)
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
