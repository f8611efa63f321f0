"""The composition root: the only modules that pick concrete stores, providers and channels
(this one, :mod:`app.compose_channels` and :mod:`app.compose_erasure`).

``gateway run``, ``gateway chat`` and the tests build a :class:`~app.server.Gateway` here from
:class:`~app.config.Settings`. With ``GATEWAY_REDIS_URL`` (and a PostgreSQL store) the
gateway is one stateless worker among several: see :mod:`gateway.edge.coordination`.
"""

from __future__ import annotations

import asyncio
import resource
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

from aiohttp import web

from app.compose_channels import build_channels
from app.compose_erasure import gateway_erasure
from app.config import Settings
from app.hints import as_typed, cli_command
from app.ledger_seed import seed_from
from app.prices import load_prices
from app.server import Gateway, opened, started
from coordination.file_pairing import FilePairingState
from coordination.local import InProcessCoordinator
from coordination.memory_ledger import MemoryLedger
from gateway.access.gate import AccessGate, AccessPolicy, ChannelRules
from gateway.access.pairing_live import LivePairing
from gateway.agent.call import BeforeCallHook
from gateway.agent.compaction import CompactionSettings
from gateway.agent.loop import AgentLoop, LoopSettings
from gateway.agent.prompt import PromptSource
from gateway.agent.recorder import SESSION_LOG
from gateway.agent.tools import ToolRegistry, ToolSet
from gateway.delivery.directory import ChannelDirectory
from gateway.delivery.history import StoreHistory
from gateway.delivery.pause import Pauses
from gateway.delivery.registry import ConversationRegistry
from gateway.delivery.router import Router
from gateway.edge.channel import Channel
from gateway.edge.commands import FORGET, REMINDERS, USAGE
from gateway.edge.coordination import Coordinator, supports_fencing
from gateway.edge.errors import ConfigError
from gateway.edge.hosts import TrustedProxies
from gateway.edge.ledger import UsageLedger
from gateway.edge.metrics import Metrics
from gateway.edge.observe import NO_OBSERVER, TurnObserver
from gateway.edge.pairing import PairingState
from gateway.edge.provider import Provider
from gateway.edge.signouts import SignOuts
from gateway.edge.tools import Tool, ToolSource
from gateway.erasure.forget import ForgetCommand
from gateway.media.images import IMAGE_LIMITS
from gateway.media.intake import FetchFile, MediaIntake
from gateway.media.policy import MediaLimits
from gateway.media.send_file import SendFileTool
from gateway.media.tool_media import ToolMediaKeeper
from gateway.media.transcribe import Transcriber
from gateway.persona.tools import persona_tools
from gateway.persona.workspace import PersonaWorkspace
from gateway.schedule import heartbeat
from gateway.schedule.clock import Clock, SystemClock
from gateway.schedule.command import RemindersCommand
from gateway.schedule.fire import Reach
from gateway.schedule.retention import Retention
from gateway.schedule.scheduler import Scheduler
from gateway.schedule.service import Schedules, ScheduleSettings
from gateway.schedule.store import ScheduleStore
from gateway.schedule.tools import schedule_tools
from gateway.usage.accounting import Accounting
from gateway.usage.command import UsageCommand
from gateway.usage.limits import Limits, LimitSettings
from sessions.blob_files import FileBlobStore
from sessions.blobs import BlobStore
from sessions.jsonl import JsonlSessionStore
from sessions.postgres import schema as pg_schema
from sessions.reserve import RESERVE_FILE, DiskReserve
from sessions.schedule_file import FileScheduleStore
from sessions.store import Durability, SessionStore
from sessions.sync_lane import SyncLane

DEFAULT_MODELS = {"anthropic": "claude-sonnet-4-5", "openai": "gpt-4o-mini", "offline": "offline-1"}


def build_store(settings: Settings, reserve: DiskReserve | None = None,
                syncer: SyncLane | None = None) -> SessionStore:
    """The one store factory: PostgreSQL when ``GATEWAY_STORE_URL`` is set, else JSONL files
    under the data dir (with the durability setting). Every command uses it; ``gateway run``
    passes the data directory's disk reserve (:func:`build_reserve`) and its sync lane (shared
    with the owed journal)."""
    return open_store(settings.data_dir, settings.store_url.get_secret_value()
                      if settings.store_url is not None else None,
                      schema=settings.store_schema, durability=settings.durability,
                      stall_after=settings.persist_timeout, reserve=reserve, syncer=syncer,
                      pool_size=settings.store_pool_size,
                      pgbouncer=settings.store_pgbouncer)


def build_reserve(settings: Settings) -> DiskReserve | None:
    """Room kept on the data directory's disk for what a stop while it is full would drop
    (JSONL store only: PostgreSQL keeps its own disk); ``None`` when it is off."""
    if settings.store_url is not None or settings.disk_reserve <= 0:
        return None
    return DiskReserve(settings.data_dir / "state" / RESERVE_FILE, settings.disk_reserve)


RERUNS_DIR = "reruns"
"""Where ``gateway replay --rerun --save`` keeps its logs: ``<data>/reruns/<tenant>/``."""


def rerun_store(data_dir: Path) -> SessionStore:
    """The store of rerun logs (JSONL, beside the sessions, never mixed with them)."""
    return JsonlSessionStore(data_dir, durability="turn", folder=RERUNS_DIR)


def open_store(data_dir: Path, store_url: str | None = None, *,
               schema: str = pg_schema.DEFAULT_SCHEMA,
               durability: Durability = "turn", stall_after: float = 2.0,
               reserve: DiskReserve | None = None,
               syncer: SyncLane | None = None, pool_size: int | None = None,
               pgbouncer: bool = False) -> SessionStore:
    """A store from its parts (operator commands whose flags override the settings).
    ``stall_after``: when a JSONL write the disk has not finished counts as failed (the
    persist timeout). ``syncer``: the JSONL files' fsyncs (:mod:`sessions.sync_lane`).
    ``pool_size``, ``pgbouncer``: the PostgreSQL store's pool (``GATEWAY_STORE_POOL_SIZE``,
    ``GATEWAY_STORE_PGBOUNCER``)."""
    if store_url is not None:
        from sessions.postgres.pool import POOL_SIZE
        from sessions.postgres.store import PostgresSessionStore

        return PostgresSessionStore(store_url, schema=schema, max_size=pool_size or POOL_SIZE,
                                    statement_cache=not pgbouncer)
    return JsonlSessionStore(data_dir, durability=durability, stall_after=stall_after,
                             reserve=reserve, syncer=syncer)


def blob_store_for(store: SessionStore, data_dir: Path,
                   durability: Durability = "turn") -> BlobStore:
    """The blob store that lives with ``store``: the PostgreSQL table beside its sessions, or
    files beside the JSONL logs (as durable as they are)."""
    # A PostgreSQL store's module is loaded exactly when such a store exists.
    pg = sys.modules.get("sessions.postgres.store")
    if pg is not None and isinstance(store, pg.PostgresSessionStore):
        from sessions.postgres.blobs import PostgresBlobStore

        return PostgresBlobStore(store)
    if isinstance(store, JsonlSessionStore):
        return FileBlobStore(store.data_dir, durable=store.durability != "none")
    return FileBlobStore(data_dir, durable=durability != "none")


@asynccontextmanager
async def schema_checked(store: SessionStore) -> AsyncIterator[None]:
    """A PostgreSQL store's schema, checked as the gateway starts: one at another version
    (never upgraded, say) stops the start with one line naming the command that fixes it,
    where it used to start healthy and fail every message. A database out of reach does not
    stop it: messages get 503 until the database is back, as in any outage."""
    pg = sys.modules.get("sessions.postgres.store")
    if pg is not None and isinstance(store, pg.PostgresSessionStore):
        try:
            await store.connect_pool()
        except pg_schema.SchemaVersionError as exc:
            raise ConfigError(as_typed(str(exc))) from exc
        except pg.StoreUnavailableError:
            pass  # an outage at start is an outage: the store answers 503 until it ends
    yield


def build_schedule_store(settings: Settings, store: SessionStore) -> ScheduleStore:
    """Schedules live with the sessions: the PostgreSQL ``schedules`` table beside a
    PostgreSQL store (shared by every worker), else ``<data>/state/schedules.jsonl``."""
    pg = sys.modules.get("sessions.postgres.store")
    if pg is not None and isinstance(store, pg.PostgresSessionStore):
        from sessions.postgres.schedules import PostgresScheduleStore

        return PostgresScheduleStore(store)
    return FileScheduleStore(settings.data_dir / "state",
                             durable=settings.durability != "none")


def schedule_settings(settings: Settings) -> ScheduleSettings:
    """``GATEWAY_SCHEDULE_*``, ``GATEWAY_TIMEZONE`` and ``GATEWAY_TENANT_TIMEZONES``."""
    return ScheduleSettings(
        grace=settings.schedule_grace, per_owner=settings.schedule_max_per_owner,
        per_tenant=settings.schedule_max_per_tenant,
        min_interval=settings.schedule_min_interval, poll=settings.schedule_poll,
        batch=settings.schedule_batch, proactive_per_minute=settings.schedule_per_minute,
        default_zone=settings.timezone, tenant_zones=settings.tenant_zone_map)


def heartbeats(settings: Settings) -> list[heartbeat.Heartbeat]:
    """``GATEWAY_HEARTBEATS`` read; :class:`ConfigError` naming what is wrong."""
    try:
        beats = heartbeat.parse(settings.heartbeats)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    for n, beat in enumerate(beats, 1):
        problem = schedule_tenant_problem(beat.channel, beat.tenant)
        if problem is not None:
            raise ConfigError(f"GATEWAY_HEARTBEATS item {n}: {problem} (\"tenant\": \"T0123\")")
    return beats


def schedule_tenant_problem(channel: str, tenant: str) -> str | None:
    """Why an operator's schedule (or heartbeat) speaking in ``channel`` cannot belong to
    ``tenant``, or None. A Slack workspace is its own tenant (its team id): a Slack schedule
    filed under any other would speak in a conversation of a tenant no Slack message reaches
    (its own session, memory and budgets)."""
    if channel != "slack":
        return None
    from channels.slack.convert import team_id

    if team_id(tenant) is None:
        return (f"a Slack schedule belongs to its workspace: the tenant is its team id "
                f"(T...), not {tenant!r}")
    return None


def build_transcriber(settings: Settings, provider: Provider) -> Transcriber | None:
    """Speech to text: the OpenAI endpoint when ``GATEWAY_TRANSCRIPTION_MODEL`` is set, the
    offline fake with the offline provider (so ``make run`` shows voice notes), else none."""
    if settings.transcription_model:
        from providers.transcription import OpenAITranscriber

        key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else "none"
        return OpenAITranscriber(api_key=key, model=settings.transcription_model,
                                 base_url=settings.openai_base_url,
                                 timeout=settings.provider_timeout,
                                 max_retries=settings.provider_retries)
    if provider.name == "offline":
        from providers.offline import OfflineTranscriber

        return OfflineTranscriber()
    return None


def media_limits(settings: Settings) -> MediaLimits:
    return MediaLimits(max_bytes=settings.max_attachment_bytes,
                       max_count=settings.max_attachments)


def build_intake(settings: Settings, provider: Provider, blobs: BlobStore,
                 transcriber: Transcriber | None, fetch: FetchFile | None = None) -> MediaIntake:
    """Attachments are fitted to the limits of the provider's request shape; ``fetch``
    downloads the files a channel hands in as references (Slack's, Telegram's)."""
    return MediaIntake(blobs, limits=media_limits(settings), images=IMAGE_LIMITS[provider.shape],
                       transcriber=transcriber, fetch=fetch)


def build_keeper(settings: Settings, provider: Provider, blobs: BlobStore) -> ToolMediaKeeper:
    """Files tools return (MCP images) are taken in like attachments: same limits, same
    fitting to the provider's request shape, the same blob store."""
    return ToolMediaKeeper(blobs, limits=media_limits(settings),
                           images=IMAGE_LIMITS[provider.shape])


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


def build_provider(settings: Settings, name: str | None = None,
                   model: str | None = None) -> Provider:
    """The provider ``name`` (default: the configured one) with ``model`` (default: the
    configured model, else the provider's default)."""
    name = name or settings.resolved_provider()
    model = model or (settings.model if name == settings.resolved_provider() else None) \
        or DEFAULT_MODELS[name]
    if name == "anthropic":
        from providers.anthropic import AnthropicProvider

        if settings.anthropic_api_key is None:
            raise ConfigError(f"the {name} provider (GATEWAY_PROVIDER or GATEWAY_FALLBACKS) "
                              "needs ANTHROPIC_API_KEY")
        return AnthropicProvider(
            api_key=settings.anthropic_api_key.get_secret_value(), model=model,
            base_url=settings.anthropic_base_url, max_tokens=settings.max_tokens,
            temperature=settings.temperature, stream=settings.stream,
            timeout=settings.provider_timeout, max_retries=settings.provider_retries,
        )
    if name == "openai":
        from providers.openai import OpenAIProvider

        key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else "none"
        return OpenAIProvider(
            api_key=key, model=model, base_url=settings.openai_base_url,
            max_tokens=settings.max_tokens, temperature=settings.temperature,
            stream=settings.stream, timeout=settings.provider_timeout,
            max_retries=settings.provider_retries,
            max_tokens_field=settings.openai_max_tokens_field,
            reasoning_effort=settings.openai_reasoning_effort,
        )
    from providers.offline import OfflineProvider

    return OfflineProvider(model=model)


def build_fallbacks(settings: Settings) -> list[Provider]:
    """The providers of ``GATEWAY_FALLBACKS``, in order."""
    return [build_provider(settings, name, model) for name, model in settings.fallback_list]


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

def build_persona(settings: Settings) -> PersonaWorkspace:
    """The persona workspace (operator, tenant and memory-scope layers)."""
    return PersonaWorkspace(settings.persona_root, self_edit=settings.persona_self_edit,
                            rescan_after=settings.persona_rescan)


def build_toolbox(settings: Settings) -> ToolSource | None:
    """The MCP servers of ``GATEWAY_MCP_CONFIG`` (not started), or None when it is unset.

    Raises :class:`ConfigError` for an unreadable or invalid file, naming the server and key."""
    if settings.mcp_config is None:
        return None
    from toolsets.mcp import McpToolbox, ToolboxSettings, load_config
    from toolsets.mcp.connection import ConnectionSettings

    return McpToolbox(load_config(settings.mcp_config), ToolboxSettings(
        connection=ConnectionSettings(
            call_timeout=settings.mcp_tool_timeout,
            max_result_chars=settings.mcp_max_result_chars,
            connect_timeout=settings.mcp_start_timeout,
            log_dir=settings.data_dir / MCP_LOGS_DIR,
            # The result's text JSON-escaped at worst, and one attachment's worth of files.
            max_message_bytes=(6 * settings.mcp_max_result_chars
                               + settings.max_attachment_bytes * 4 // 3 + 64 * 1024),
        ),
        start_timeout=settings.mcp_start_timeout,
    ))


def tool_secrets(settings: Settings) -> list[str]:
    """Values of the MCP servers' headers and env (tokens, as a rule), for log redaction.
    An invalid file gives none here: building the gateway reports it."""
    if settings.mcp_config is None:
        return []
    from toolsets.mcp import load_config

    try:
        return load_config(settings.mcp_config).secrets()
    except ConfigError:
        return []


async def tool_servers_report(settings: Settings) -> list[dict[str, Any]] | None:
    """Start every configured MCP server once, report its state and tools, stop them all
    (``gateway tools list``). None when ``GATEWAY_MCP_CONFIG`` is unset."""
    if settings.mcp_config is None:
        return None
    from toolsets.mcp import McpToolbox

    toolbox = build_toolbox(settings)
    assert isinstance(toolbox, McpToolbox)
    async with toolbox:
        return toolbox.report()


@asynccontextmanager
async def live_tool_set(settings: Settings, tenant: str, *, enabled: bool = True,
                        provider: Provider | None = None, blobs: BlobStore | None = None,
                        ) -> AsyncIterator[ToolSet | None]:
    """The MCP tools ``tenant`` sees, with their servers running (``gateway replay --rerun
    --live-tools``); None when not enabled. Persona tools are never part of it. Files the
    tools return go to ``blobs`` (fitted for ``provider``), as in a live turn: the same
    image is the same reference, so a live result compares equal to the recorded one."""
    toolbox = build_toolbox(settings) if enabled else None
    if not enabled:
        yield None
        return
    keeper = (build_keeper(settings, provider, blobs)
              if provider is not None and blobs is not None else None)
    if toolbox is None:
        yield ToolSet([], keeper)
        return
    try:
        await toolbox.start()
        yield ToolSet(toolbox.tools_for(tenant), keeper)
    finally:
        await toolbox.aclose()


MCP_LOGS_DIR = "mcp-logs"
"""Where stdio MCP servers' stderr goes: ``<data>/mcp-logs/<server>.log``."""


def build_loop(
    settings: Settings,
    provider: Provider,
    metrics: Metrics,
    *,
    prompts: PromptSource | None = None,
    tools: ToolRegistry | None = None,
    hooks: Sequence[BeforeCallHook] = (),
    observer: TurnObserver = NO_OBSERVER,
    blobs: BlobStore | None = None,
    workspace: PersonaWorkspace | None = None,
    fallbacks: Sequence[Provider] = (),
    ledger: UsageLedger | None = None,
    extra_tools: Sequence[Tool] = (),
) -> AgentLoop:
    if prompts is None or tools is None:
        workspace = workspace or build_persona(settings)
        prompts = prompts or workspace
        extra = [*([SendFileTool(blobs)] if blobs is not None else []), *extra_tools]
        if tools is None:
            toolbox = build_toolbox(settings)
            tools = ToolRegistry([*persona_tools(workspace), *extra],
                                 sources=[toolbox] if toolbox is not None else [],
                                 keeper=(build_keeper(settings, provider, blobs)
                                         if blobs is not None else None))
    return AgentLoop(
        provider=provider, prompts=prompts, tools=tools, recorder=SESSION_LOG, hooks=hooks,
        metrics=metrics,
        settings=LoopSettings(max_iterations=settings.max_iterations,
                              window_tokens=settings.window_tokens,
                              prompt_cache=settings.prompt_cache,
                              compaction=CompactionSettings(enabled=settings.compaction)),
        observer=observer,
        accounting=Accounting(metrics, load_prices(settings.prices_file), ledger),
        blobs=blobs,
        fallbacks=fallbacks,
        limits=(Limits(limit_settings(settings), ledger)
                if ledger is not None and limit_settings(settings).any else None),
    )


def open_sessions_bound(settings: Settings, store: SessionStore) -> int | None:
    """How many sessions may stay open by count: ``GATEWAY_MAX_OPEN_SESSIONS``, else for a
    JSONL store (a descriptor each) a quarter of the descriptors the process may open, at
    most 4,096; a PostgreSQL store holds none (memory alone bounds it)."""
    if settings.max_open_sessions is not None:
        return settings.max_open_sessions
    if not isinstance(store, JsonlSessionStore):
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(64, min(soft // 4, 4096))


def limit_settings(settings: Settings) -> LimitSettings:
    """Budgets and the rate limit from ``GATEWAY_BUDGET_*`` and ``GATEWAY_RATE_LIMIT_*``."""
    return LimitSettings(
        user_tokens=settings.budget_user_tokens, user_usd=settings.budget_user_usd,
        tenant_tokens=settings.budget_tenant_tokens, tenant_usd=settings.budget_tenant_usd,
        user_messages=settings.rate_limit_messages, user_window=settings.rate_limit_seconds)


def build_ledger(settings: Settings, store: SessionStore) -> UsageLedger:
    """Usage totals in the workers' Redis when they share one, else in this process (seeded
    from today's logs on first use, so a restart does not reset a budget)."""
    if settings.redis_url is not None:
        from coordination.redis_ledger import KEEP_DAYS, RedisLedger
        from sessions.retention import keep_seconds

        policy = settings.retention
        return RedisLedger(settings.redis_url.get_secret_value(), settings.redis_prefix,
                           keep=lambda tenant: keep_seconds(policy, tenant, KEEP_DAYS))
    return MemoryLedger(seed_from(store, load_prices(settings.prices_file)))


def pairing_state(data_dir: Path, redis_url: str | None,
                  redis_prefix: str | None = None) -> PairingState:
    """Where pairing codes and approvals live for the CLI: the workers' Redis when they share
    one (so an approval reaches every worker), else the gateway's private file."""
    if redis_url is None:
        return FilePairingState.under(data_dir)
    from coordination.keys import Keys
    from coordination.redis_pairing import RedisPairingState

    return RedisPairingState(redis_url, Keys(redis_prefix or Keys().prefix).pairing)


def build_access(settings: Settings, coordinator: Coordinator | None = None) -> AccessPolicy:
    """Allowlists per channel and DM pairing (see :mod:`gateway.access.gate`)."""
    rules = {
        "telegram": ChannelRules(
            users=Settings.id_list(settings.telegram_allowed_users),
            chats=Settings.id_list(settings.telegram_allowed_chats),
            pairing=settings.pairing,
        ),
        "slack": ChannelRules(
            users=Settings.id_list(settings.slack_allowed_users),
            chats=Settings.id_list(settings.slack_allowed_channels),
            pairing=settings.pairing,
        ),
    }
    state = coordinator.pairing_state() if coordinator is not None else None
    pairing = LivePairing(state or FilePairingState.under(settings.data_dir))
    return AccessPolicy(rules=rules, pairing=pairing,
                        approve_command=f"{cli_command()} pairing approve")


def build_signouts(settings: Settings) -> SignOuts:
    """Admin sign-outs: in the workers' Redis when they share one (a sign-out on one worker
    ends the sign-in on all), else in this process."""
    from app.admin.auth import Revoked

    if settings.redis_url is None:
        return Revoked()
    from coordination.redis_signouts import RedisSignOuts

    return RedisSignOuts(settings.redis_url.get_secret_value(), settings.redis_prefix,
                         Revoked())


def build_admin_routes(settings: Settings, store: SessionStore,
                       blobs: BlobStore | None = None,
                       signouts: SignOuts | None = None) -> list[web.RouteDef]:
    """The session viewer under ``/admin``, only when ``GATEWAY_ADMIN_TOKEN`` is set."""
    if settings.admin_token is None or not settings.admin_token.get_secret_value():
        return []
    from app.admin import Access, AdminSite

    return AdminSite(store, Access(settings.admin_token.get_secret_value()),
                     prices=load_prices(settings.prices_file), blobs=blobs,
                     proxies=TrustedProxies.parse(settings.trusted_proxies),
                     signouts=signouts).routes()


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
