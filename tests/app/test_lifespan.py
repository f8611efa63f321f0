"""The gateway's one lifespan: parts start in order and stop in reverse, between the router's
drain with the channels first and the HTTP server last; a failed step never stops the rest."""

from __future__ import annotations

import logging
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import pytest

from app.compose import build_gateway
from app.config import Settings
from app.server import Gateway, Part, opened, started
from tests.fakes.memory_channel import MemoryChannel


def settings(data_dir: Path, **extra: Any) -> Settings:
    values: dict[str, Any] = {
        "GATEWAY_DATA_DIR": data_dir, "GATEWAY_HOST": "127.0.0.1", "GATEWAY_PORT": 0,
        "GATEWAY_PROVIDER": "offline", "GATEWAY_SHUTDOWN_GRACE": 0.2,
    }
    values.update(extra)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]  # pydantic-settings init


class Step:
    """A part that notes its start and stop in ``events``; ``fail`` makes its stop raise."""

    def __init__(self, name: str, events: list[str], *, fail: bool = False) -> None:
        self.name = name
        self.events = events
        self.fail = fail

    async def __aenter__(self) -> Step:
        self.events.append(f"start {self.name}")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self.events.append(f"stop {self.name}")
        if self.fail:
            raise OSError("the disk is gone")


class Client:
    """A client open since it was built; its close asks the gateway's /healthz, to see
    whether the HTTP server still answers at that point."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.gateway: Gateway | None = None

    async def aclose(self) -> None:
        assert self.gateway is not None
        url = f"http://127.0.0.1:{self.gateway.bound_port}/healthz"
        async with aiohttp.ClientSession() as http, http.get(url) as response:
            self.events.append(f"close client (healthz {response.status})")


class NotedChannel(MemoryChannel):
    """Notes its start and close, and whether the router was draining when it closed."""

    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.noted = events
        self.router_closing: bool | None = None

    async def start(self, deliver: Any) -> None:
        self.noted.append("start channel")
        await super().start(deliver)

    async def aclose(self) -> None:
        self.noted.append("close channel")
        await super().aclose()


def wired(tmp_path: Path, events: list[str], parts: list[Part]) -> Gateway:
    """A real gateway's router and channel, with ``parts`` around the real ones."""
    channel = NotedChannel(events)
    base = build_gateway(settings(tmp_path), channels=[channel])
    router = base.router
    drain = router.drain

    async def noted_drain(grace: float) -> None:
        events.append(f"drain {grace:g}")
        await drain(grace)

    router.drain = noted_drain  # type: ignore[method-assign]  # noting our own seam
    return Gateway(store=base.store, provider=base.provider, router=router,
                   registry=base.registry, coordinator=base.coordinator,
                   channels=base.channels, deliver=base.deliver, metrics=base.metrics,
                   host="127.0.0.1", port=0, shutdown_grace=0.2,
                   parts=[parts[0], *base.parts, *parts[1:]])


async def test_parts_start_in_order_and_stop_in_reverse(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Start: parts in order, the HTTP server, the channels. Stop: the router drains (with
    the grace) while the channels are still open, the channels close, the parts stop in
    reverse (one that fails is one warning, and the next still stops; the router's own exit
    drains again, with nothing left), and the HTTP server answers until the last part has
    closed."""
    events: list[str] = []
    client = Client(events)
    gateway = wired(tmp_path, events, [opened("client", client), started("a", Step("a", events)),
                                       started("b", Step("b", events, fail=True)),
                                       started("c", Step("c", events))])
    client.gateway = gateway
    with caplog.at_level(logging.WARNING, logger="app.server"):
        async with gateway.lifespan():
            events.append("serving")
        await gateway.aclose()  # a second stop is a no-op
    assert events == [
        "start a", "start b", "start c", "start channel", "serving",
        "drain 0.2", "close channel", "stop c", "stop b", "stop a", "drain 0",
        "close client (healthz 200)",
    ]
    assert [r.getMessage() for r in caplog.records] == [
        "shutdown: b failed to close (OSError)"]


class Noted:
    """A client open since it was built; notes its close."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    async def aclose(self) -> None:
        self.events.append("close noted")


async def test_a_failed_start_stops_what_had_started(tmp_path: Path) -> None:
    """A part that cannot start stops the start: what started before it stops again, in
    reverse, and the parts open since they were built are closed; nothing after it starts,
    and closing afterwards closes nothing twice."""
    events: list[str] = []

    class Refusing(Step):
        async def __aenter__(self) -> Step:
            raise OSError("cannot start")

    gateway = wired(tmp_path, events, [opened("noted", Noted(events)),
                                       started("a", Step("a", events)),
                                       started("b", Refusing("b", events)),
                                       started("c", Step("c", events))])
    with pytest.raises(OSError, match="cannot start"):
        await gateway.start()
    await gateway.aclose()
    assert events == ["start a", "stop a", "drain 0", "close noted"]


async def test_a_gateway_never_started_closes_what_was_open_since_it_was_built(
        tmp_path: Path) -> None:
    """Closing a gateway that never started closes its clients and stores (once), and starts
    or stops nothing else."""
    events: list[str] = []
    gateway = wired(tmp_path, events, [opened("noted", Noted(events)),
                                       started("a", Step("a", events))])
    await gateway.aclose()
    await gateway.aclose()
    assert events == ["close noted"]
