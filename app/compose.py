"""The composition root: the only modules that pick concrete stores, providers and channels
(this one and its parts beside it, one kind of part each: :mod:`app.compose_store`,
:mod:`app.compose_schedule`, :mod:`app.compose_providers`, :mod:`app.compose_media`,
:mod:`app.compose_tools`, :mod:`app.compose_loop`, :mod:`app.compose_usage`,
:mod:`app.compose_access`, :mod:`app.compose_channels` and :mod:`app.compose_erasure`).

``gateway run``, ``gateway chat`` and the tests build a :class:`~app.server.Gateway` here from
:class:`~app.config.Settings`. With ``GATEWAY_REDIS_URL`` (and a PostgreSQL store) the
gateway is one stateless worker among several: see :mod:`gateway.edge.coordination`. This
module holds the wiring itself (:func:`build_gateway`: every part, in start order) and the
two choices every part follows: the coordinator and the observer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import cast

from app.compose_access import build_access, build_admin_routes, build_signouts
from app.compose_channels import build_channels
from app.compose_erasure import gateway_erasure
from app.compose_loop import build_loop, build_persona
from app.compose_media import build_intake
from app.compose_providers import build_fallbacks, build_provider, build_transcriber
from app.compose_schedule import build_schedule_store, heartbeats, schedule_settings
from app.compose_store import (
    blob_store_for,
    build_reserve,
    build_store,
    open_sessions_bound,
    rerun_store,
    schema_checked,
)
from app.compose_usage import build_ledger, limit_settings
from app.config import Settings
from app.server import Gateway, opened, started
from coordination.local import InProcessCoordinator
from gateway.access.gate import AccessGate, AccessPolicy
from gateway.access.pairing_live import LivePairing
from gateway.agent.call import BeforeCallHook
from gateway.agent.prompt import PromptSource
from gateway.agent.tools import ToolRegistry
from gateway.delivery.directory import ChannelDirectory
from gateway.delivery.history import StoreHistory
from gateway.delivery.pause import Pauses
from gateway.delivery.registry import ConversationRegistry
from gateway.delivery.router import Router
from gateway.edge.channel import Channel
from gateway.edge.commands import FORGET, REMINDERS, USAGE
from gateway.edge.coordination import Coordinator, supports_fencing
from gateway.edge.errors import ConfigError
from gateway.edge.metrics import Metrics
from gateway.edge.observe import NO_OBSERVER, TurnObserver
from gateway.edge.provider import Provider
from gateway.erasure.forget import ForgetCommand
from gateway.media.transcribe import Transcriber
from gateway.schedule import heartbeat
from gateway.schedule.clock import Clock, SystemClock
from gateway.schedule.command import RemindersCommand
from gateway.schedule.fire import Reach
from gateway.schedule.retention import Retention
from gateway.schedule.scheduler import Scheduler
from gateway.schedule.service import Schedules
from gateway.schedule.tools import schedule_tools
from gateway.usage.command import UsageCommand
from sessions.blobs import BlobStore
from sessions.reserve import DiskReserve
from sessions.store import SessionStore
from sessions.sync_lane import SyncLane


def build_coordinator(settings: Settings, store: SessionStore | None = None,
                      reserve: DiskReserve | None = None,
                      syncer: SyncLane | None = None) -> Coordinator:
    """Redis when ``GATEWAY_REDIS_URL`` is set (several workers, what they owe kept in the
    PostgreSQL ``store``), else this process alone, with its owed journal under the data
    directory."""
    if settings.redis_url is None:
        return InProcessCoordinator(settings.data_dir, fsync=settings.durability,
                                    reserve=reserve, syncer=syncer,
                                    dedup_memory=settings.dedup_memory)
    if settings.store_url is None:
        raise ConfigError("GATEWAY_REDIS_URL needs GATEWAY_STORE_URL: workers share their "
                          "sessions through PostgreSQL")
    store = store if store is not None else build_store(settings)
    if not supports_fencing(store):
        raise ConfigError("several workers need a session store with fencing tokens "
                          "(PostgreSQL: GATEWAY_STORE_URL)")
    from coordination.redis_coordinator import RedisCoordinator
    from sessions.postgres.inbox import PostgresInbox
    from sessions.postgres.store import PostgresSessionStore

    return RedisCoordinator(settings.redis_url.get_secret_value(),
                            PostgresInbox(cast(PostgresSessionStore, store)),
                            prefix=settings.redis_prefix, lease_ttl=settings.lease_ttl,
                            linger=settings.lease_linger)


def build_observer(settings: Settings) -> TurnObserver:
    """Live OpenTelemetry traces over OTLP/HTTP when an endpoint is configured, else none."""
    endpoint = settings.traces_endpoint()
    if endpoint is None:
        return NO_OBSERVER
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from app.telemetry import TraceOptions, otlp_observer

    address, port = settings.provider_server()
    options = TraceOptions(capture_content=settings.otel_capture_content,
                           server_address=address, server_port=port)
    return otlp_observer(OTLPSpanExporter(endpoint=endpoint), options)


def build_gateway(
    settings: Settings,
    *,
    store: SessionStore | None = None,
    provider: Provider | None = None,
    channels: Sequence[Channel] | None = None,
    prompts: PromptSource | None = None,
    tools: ToolRegistry | None = None,
    hooks: Sequence[BeforeCallHook] = (),
    access: AccessPolicy | None = None,
    coordinator: Coordinator | None = None,
    observer: TurnObserver | None = None,
    blobs: BlobStore | None = None,
    transcriber: Transcriber | None = None,
    fallbacks: Sequence[Provider] | None = None,
    clock: Clock | None = None,
) -> Gateway:
    """Wire a gateway. Tests pass their own fakes for any part; the rest comes from settings.
    ``clock``: what the scheduler reads and waits on (a test's fake clock)."""
    metrics = Metrics()
    observer = observer or build_observer(settings)
    reserve = build_reserve(settings)  # one file, shared by the store and the journal
    # One thread for the data directory's fsyncs: a turn's session fsync and the journal's
    # share rounds with those of the turns ending beside it (sessions/sync_lane.py).
    syncer = SyncLane(name="fsync:data")
    store = store or build_store(settings, reserve, syncer)
    coordinator = coordinator or build_coordinator(settings, store, reserve, syncer)
    blobs = blobs or blob_store_for(store, settings.data_dir, settings.durability)
    if not coordinator.conversations.records_on_receipt and not supports_fencing(store):
        raise ConfigError("several workers need a session store with fencing tokens "
                          "(PostgreSQL: GATEWAY_STORE_URL)")
    provider = provider or build_provider(settings)
    transcriber = transcriber or build_transcriber(settings, provider)
    # The channels first: the parts that reach a channel again mid-message (the router for
    # replies, the intake for downloads, the gate for refusals) are handed their directory.
    directory = ChannelDirectory(
        channels if channels is not None
        else build_channels(settings, StoreHistory(store, blobs), metrics, coordinator))
    intake = build_intake(settings, provider, blobs, transcriber, fetch=directory.fetch_file)
    workspace = build_persona(settings) if prompts is None or tools is None else None
    fallbacks = list(fallbacks) if fallbacks is not None else build_fallbacks(settings)
    ledger = build_ledger(settings, store)
    schedule_store = build_schedule_store(settings, store)
    beats = heartbeats(settings)
    # Setting a schedule wakes the scheduler (built after the router, which the schedule
    # tools' loop needs) through an event both are given.
    schedule_woken = asyncio.Event()
    schedules = Schedules(schedule_store, schedule_settings(settings), clock or SystemClock(),
                          wake=schedule_woken.set)
    loop = build_loop(settings, provider, metrics, prompts=prompts, tools=tools, hooks=hooks,
                      observer=observer, blobs=blobs, workspace=workspace, fallbacks=fallbacks,
                      ledger=ledger, extra_tools=schedule_tools(schedules))
    registry = ConversationRegistry(store, metrics, persist_timeout=settings.persist_timeout,
                                    max_open=open_sessions_bound(settings, store),
                                    max_bytes=settings.open_sessions_memory,
                                    idle_rotate=settings.idle_rotate)

    # What an erasure holds still: built before the router (which brackets its work with them)
    # and the erasure service (which waits on them).
    pauses = Pauses(registry)
    erasure, erasure_endpoint = gateway_erasure(settings, store, workspace, blobs,
                                                rerun_store(settings.data_dir), coordinator,
                                                pauses, schedule_store)
    handlers = {FORGET.name: ForgetCommand(erasure).run,
                USAGE.name: UsageCommand(ledger, limit_settings(settings)).run,
                REMINDERS.name: RemindersCommand(schedules).run}
    router = Router(registry=registry, loop=loop, sink_for=directory.sink_for,
                    metrics=metrics, max_concurrent_turns=settings.turn_limit,
                    max_concurrent_downloads=settings.max_concurrent_downloads,
                    conversations=coordinator.conversations, handlers=handlers,
                    wait_for_channels=True, take_in=intake.prepare, pauses=pauses)
    retention = Retention(settings.retention, store, blobs, schedules.clock,
                          blob_stores=[store, rerun_store(settings.data_dir)],
                          elector=coordinator.elector("retention"), metrics=metrics)
    scheduler = Scheduler(
        schedule_store, schedules.settings, schedules.clock, deliver=router.deliver,
        reach=Reach(directory.named, store),
        ledger=ledger, ready=router.channels_ready,
        heartbeats=lambda: heartbeat.ensure(schedule_store, beats, schedules.clock.now(),
                                            settings.timezone),
        woken=schedule_woken, metrics=metrics)
    policy = access or build_access(settings, coordinator)
    # The intake sits behind the gate: only people allowed to talk get files stored.
    gate = AccessGate(policy, intake.wrap(router.deliver), directory.notify, metrics)
    signouts = (build_signouts(settings) if settings.admin_token is not None
                and settings.admin_token.get_secret_value() else None)
    # The gateway's parts in start order; they stop in reverse (app/server.py): what the
    # others use (the tracer, the provider, the store) last.
    parts = [
        opened("traces", observer), opened("provider", provider), opened("store", store),
        started("store schema", schema_checked(store)),
        *([opened("transcription", transcriber)] if transcriber is not None else []),
        *(opened(f"fallback {f.name}", f) for f in reversed(fallbacks)),
        opened("schedules", schedule_store), opened("usage ledger", ledger),
        opened("blobs", blobs),
        started("coordinator", coordinator), opened("sessions", registry),
        started("router", router),
        *([started("pairing", policy.pairing)] if isinstance(policy.pairing, LivePairing)
          else []),
        started("tools", loop.tools), started("erasure endpoint", erasure_endpoint),
        started("scheduler", scheduler), started("retention", retention),
        *([opened("admin sign-outs", signouts)] if signouts is not None else []),
    ]
    return Gateway(
        store=store, provider=provider, router=router, registry=registry,
        coordinator=coordinator, channels=directory.channels, deliver=gate.deliver,
        metrics=metrics, host=settings.host, port=settings.port,
        shutdown_grace=settings.shutdown_grace, parts=parts,
        extra_routes=build_admin_routes(settings, store, blobs, signouts),
        health_parts={"mcp": loop.tools.health} if loop.tools.sources else None,
        http_timeout=settings.http_timeout,
        metrics_token=(settings.metrics_token.get_secret_value()
                       if settings.metrics_token is not None else None),
    )
