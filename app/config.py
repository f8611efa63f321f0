"""Settings, from the environment and ``.env`` (pydantic-settings).

Every setting is documented in ``config.example.env``. Secrets are ``SecretStr`` so they never
print in reprs, logs or error messages; a validation error names the setting, not its value.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import unquote, urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.logs import parse_levels
from gateway.edge.hosts import TrustedProxies
from gateway.edge.ids import WEB_TENANT
from sessions.names import validate_tenant
from sessions.postgres import schema as pg_schema
from sessions.store import Durability

if TYPE_CHECKING:
    from sessions.retention import RetentionPolicy

ProviderName = Literal["auto", "offline", "anthropic", "openai"]
FALLBACK_PROVIDERS = ("anthropic", "openai", "offline")
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]
MIN_TOKEN_CHARS = 16
MIN_ADMIN_TOKEN_CHARS = 32
MIN_ADMIN_TOKEN_DISTINCT = 10
"""Different characters the admin token must have: 32 of a kind, or a word repeated, is no
random token (a random 32-character token of any usual alphabet has 14 or more)."""


def _env(name: str) -> AliasChoices:
    return AliasChoices(name)


def _checked_zone(name: str) -> str:
    try:
        return ZoneInfo(name.strip()).key
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"{name[:60]!r} is not a time zone name (e.g. Europe/Berlin, UTC)") \
            from exc


def zone_pairs(value: str) -> dict[str, str]:
    """``GATEWAY_TENANT_TIMEZONES`` (``TENANT=ZONE,...``) as a mapping, each zone checked."""
    pairs: dict[str, str] = {}
    for item in (v.strip() for v in value.split(",") if v.strip()):
        tenant, sep, name = item.partition("=")
        if not sep or not tenant.strip():
            raise ValueError(f"{item[:60]!r}: give TENANT=ZONE (e.g. T0123=Europe/Berlin)")
        pairs[tenant.strip()] = _checked_zone(name)
    return pairs


class Settings(BaseSettings):
    """All gateway settings. Names are the environment variables."""

    model_config = SettingsConfigDict(
        env_file=".env", env_file_encoding="utf-8", extra="ignore", populate_by_name=False,
        hide_input_in_errors=True,
    )

    # -- core ---------------------------------------------------------------------------------
    data_dir: Path = Field(Path("./data"), validation_alias=_env("GATEWAY_DATA_DIR"))
    persona_dir: Path | None = Field(None, validation_alias=_env("GATEWAY_PERSONA_DIR"))
    host: str = Field("127.0.0.1", validation_alias=_env("GATEWAY_HOST"))
    port: int = Field(8787, ge=0, le=65535, validation_alias=_env("GATEWAY_PORT"))
    channels: str = Field("web", validation_alias=_env("GATEWAY_CHANNELS"))
    log_format: Literal["text", "json"] = Field("text", validation_alias=_env("GATEWAY_LOG_FORMAT"))
    log_level: str = Field("INFO", validation_alias=_env("GATEWAY_LOG_LEVEL"))
    # Per-logger levels (httpx2=DEBUG,openai=INFO); client libraries stay at WARNING otherwise.
    log_levels: str = Field("", validation_alias=_env("GATEWAY_LOG_LEVELS"))
    durability: Durability = Field("turn", validation_alias=_env("GATEWAY_DURABILITY"))
    # Bytes kept free on the data directory's disk for what a stop while it is full must still
    # write (sessions.reserve); 0 turns it off.
    disk_reserve: int = Field(4 * 1024 * 1024, ge=0,
                              validation_alias=_env("GATEWAY_DISK_RESERVE"))
    # PostgreSQL session store (postgresql://user:password@host:port/db); unset: JSONL files.
    # Secret: the URL may carry a password.
    store_url: SecretStr | None = Field(None, validation_alias=_env("GATEWAY_STORE_URL"))
    # PostgreSQL schema of the session tables (several deployments can share a database).
    store_schema: str = Field(pg_schema.DEFAULT_SCHEMA,
                              validation_alias=_env("GATEWAY_STORE_SCHEMA"))
    # Connections one worker's store opens at most (every worker's together stay under the
    # server's max_connections).
    store_pool_size: int = Field(5, ge=1, le=1000,
                                 validation_alias=_env("GATEWAY_STORE_POOL_SIZE"))
    # The store is reached through PgBouncer in transaction mode: no prepared statements kept.
    store_pgbouncer: bool = Field(False, validation_alias=_env("GATEWAY_STORE_PGBOUNCER"))
    persist_timeout: float = Field(2.0, gt=0, validation_alias=_env("GATEWAY_PERSIST_TIMEOUT"))
    # Days a session (and the files only it refers to) is kept after its last entry; 0:
    # forever. Per tenant: T0123=30,default=7 (0: forever). Applied hourly by the running
    # gateway and by `gateway prune`.
    retention_days: float = Field(0.0, ge=0, validation_alias=_env("GATEWAY_RETENTION_DAYS"))
    retention_tenants: str = Field("", validation_alias=_env("GATEWAY_RETENTION_TENANTS"))
    shutdown_grace: float = Field(10.0, ge=0, validation_alias=_env("GATEWAY_SHUTDOWN_GRACE"))
    # Turns one worker runs at once: a number, or auto (derived from the model's latency and
    # the CPU a turn costs: gateway/delivery/limit.py).
    max_concurrent_turns: int | Literal["auto"] = Field(
        "auto", validation_alias=_env("GATEWAY_MAX_CONCURRENT_TURNS"))
    # Files fetched as their turn starts, downloading at once at most (each may be held whole).
    max_concurrent_downloads: int = Field(
        16, ge=1, validation_alias=_env("GATEWAY_MAX_CONCURRENT_DOWNLOADS"))
    # Sessions kept open at once, by count (unset: JSONL, a quarter of the file descriptors
    # the process may open, at most 4,096; PostgreSQL, no count) and by memory, in bytes (the
    # least recently used are closed first).
    max_open_sessions: int | None = Field(None, ge=1,
                                          validation_alias=_env("GATEWAY_MAX_OPEN_SESSIONS"))
    open_sessions_memory: int = Field(256 * 1024 * 1024, ge=1024 * 1024,
                                      validation_alias=_env("GATEWAY_OPEN_SESSIONS_MEMORY"))
    # One process (no Redis): what the owed journal's duplicate check may hold in memory, in
    # bytes (~200 a message answered in the last 25 h; past it the oldest are forgotten early,
    # counted in /healthz and logged: coordination/seen_keys.py).
    dedup_memory: int = Field(64 * 1024 * 1024, ge=64 * 1024,
                              validation_alias=_env("GATEWAY_DEDUP_MEMORY"))
    window_tokens: int = Field(16_000, ge=64, validation_alias=_env("GATEWAY_WINDOW_TOKENS"))
    max_iterations: int = Field(8, ge=1, validation_alias=_env("GATEWAY_MAX_ITERATIONS"))
    max_message_chars: int = Field(16_000, ge=1,
                                   validation_alias=_env("GATEWAY_MAX_MESSAGE_CHARS"))
    web_token: SecretStr | None = Field(None, validation_alias=_env("GATEWAY_WEB_TOKEN"))
    admin_token: SecretStr | None = Field(None, validation_alias=_env("GATEWAY_ADMIN_TOKEN"))
    # The web chat's tenant: its sessions, memory and budgets, apart from Telegram's.
    web_tenant: str = Field(WEB_TENANT, validation_alias=_env("GATEWAY_WEB_TENANT"))
    # Reverse proxies whose X-Forwarded-For / -Proto are believed (addresses or networks).
    trusted_proxies: str = Field("", validation_alias=_env("GATEWAY_TRUSTED_PROXIES"))
    # /metrics and the details of /healthz: with a token, Bearer <token>; without, loopback only.
    metrics_token: SecretStr | None = Field(None,
                                            validation_alias=_env("GATEWAY_METRICS_TOKEN"))
    http_timeout: float = Field(15.0, gt=0, le=300,
                                validation_alias=_env("GATEWAY_HTTP_TIMEOUT"))

    # -- attachments ----------------------------------------------------------------------------
    max_attachment_bytes: int = Field(20 * 1024 * 1024, ge=1,
                                      validation_alias=_env("GATEWAY_MAX_ATTACHMENT_BYTES"))
    max_attachments: int = Field(10, ge=0, le=100, validation_alias=_env("GATEWAY_MAX_ATTACHMENTS"))
    # Speech to text through the OpenAI audio endpoint (OPENAI_BASE_URL, OPENAI_API_KEY);
    # unset: voice notes are refused, except with the offline provider (a fake transcriber).
    transcription_model: str | None = Field(None,
                                            validation_alias=_env("GATEWAY_TRANSCRIPTION_MODEL"))

    idle_rotate: float = Field(0.0, ge=0, validation_alias=_env("GATEWAY_IDLE_ROTATE"))
    typing_delay: float = Field(0.5, ge=0, validation_alias=_env("GATEWAY_TYPING_DELAY"))
    pairing: bool = Field(True, validation_alias=_env("GATEWAY_PAIRING"))
    # Let the model's soul_patch tool edit the operator's SOUL.md (shared by every tenant).
    persona_self_edit: bool = Field(False, validation_alias=_env("GATEWAY_PERSONA_SELF_EDIT"))
    # Seconds between scans of the operator's and tenants' persona files for edits made by hand
    # (0: on every prompt build). A person's own memory files are checked on every build.
    persona_rescan: float = Field(1.0, ge=0, le=3600,
                                  validation_alias=_env("GATEWAY_PERSONA_RESCAN"))

    # -- several workers (see gateway.edge.coordination) -----------------------------------------
    # Redis shared by the workers (redis://[:password@]host:port/db); unset: one process.
    # Secret: the URL may carry a password.
    redis_url: SecretStr | None = Field(None, validation_alias=_env("GATEWAY_REDIS_URL"))
    redis_prefix: str = Field("gw:", min_length=1, max_length=64,
                              validation_alias=_env("GATEWAY_REDIS_PREFIX"))
    lease_ttl: float = Field(15.0, ge=1.0, le=30.0, validation_alias=_env("GATEWAY_LEASE_TTL"))
    # Seconds a worker keeps a conversation's lease after answering its last queued message,
    # waiting for the next one (same lease, same token, session as it is); 0: let go at once.
    lease_linger: float = Field(10.0, ge=0.0, le=300.0,
                                validation_alias=_env("GATEWAY_LEASE_LINGER"))

    # -- OpenTelemetry (the standard variables; live traces when an endpoint is set) -------
    otel_endpoint: str | None = Field(None, validation_alias=_env("OTEL_EXPORTER_OTLP_ENDPOINT"))
    otel_traces_endpoint: str | None = Field(
        None, validation_alias=_env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
    otel_traces_exporter: str = Field("otlp", validation_alias=_env("OTEL_TRACES_EXPORTER"))
    otel_sdk_disabled: bool = Field(False, validation_alias=_env("OTEL_SDK_DISABLED"))
    # OTLP over HTTP with protobuf is what app/telemetry.py sends; another protocol is refused
    # rather than sent to an endpoint that expects something else.
    otel_protocol: Literal["http/protobuf"] = Field(
        "http/protobuf", validation_alias=AliasChoices("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                                                       "OTEL_EXPORTER_OTLP_PROTOCOL"))
    otel_capture_content: bool = Field(
        False, validation_alias=_env("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"))

    # -- tools: MCP servers (see toolsets/mcp) -------------------------------------------------
    # JSON file in the mcpServers shape; unset: no MCP tools.
    mcp_config: Path | None = Field(None, validation_alias=_env("GATEWAY_MCP_CONFIG"))
    mcp_tool_timeout: float = Field(30.0, gt=0, validation_alias=_env("GATEWAY_MCP_TOOL_TIMEOUT"))
    mcp_max_result_chars: int = Field(16_000, ge=100,
                                      validation_alias=_env("GATEWAY_MCP_MAX_RESULT_CHARS"))
    mcp_start_timeout: float = Field(20.0, gt=0,
                                     validation_alias=_env("GATEWAY_MCP_START_TIMEOUT"))

    # -- telegram -----------------------------------------------------------------------------
    telegram_bot_token: SecretStr | None = Field(None, validation_alias=_env("TELEGRAM_BOT_TOKEN"))
    telegram_mode: Literal["polling", "webhook"] = Field(
        "polling", validation_alias=_env("TELEGRAM_MODE"))
    telegram_webhook_secret: SecretStr | None = Field(
        None, validation_alias=_env("TELEGRAM_WEBHOOK_SECRET"))
    telegram_webhook_url: str | None = Field(None, validation_alias=_env("TELEGRAM_WEBHOOK_URL"))
    telegram_api_base_url: str | None = Field(None,
                                              validation_alias=_env("TELEGRAM_API_BASE_URL"))
    telegram_file_base_url: str | None = Field(None,
                                               validation_alias=_env("TELEGRAM_FILE_BASE_URL"))
    telegram_allowed_users: str = Field("", validation_alias=_env("TELEGRAM_ALLOWED_USERS"))
    telegram_allowed_chats: str = Field("", validation_alias=_env("TELEGRAM_ALLOWED_CHATS"))
    telegram_group_mode: Literal["mention", "all"] = Field(
        "mention", validation_alias=_env("TELEGRAM_GROUP_MODE"))
    telegram_rate_limit: Literal["on", "off"] = Field(
        "on", validation_alias=_env("TELEGRAM_RATE_LIMIT"))
    telegram_poll_timeout: int = Field(30, ge=0, le=50,
                                       validation_alias=_env("TELEGRAM_POLL_TIMEOUT"))
    telegram_stall_seconds: float = Field(90.0, gt=0,
                                          validation_alias=_env("TELEGRAM_STALL_SECONDS"))

    # -- slack --------------------------------------------------------------------------------
    slack_bot_token: SecretStr | None = Field(None, validation_alias=_env("SLACK_BOT_TOKEN"))
    slack_signing_secret: SecretStr | None = Field(
        None, validation_alias=_env("SLACK_SIGNING_SECRET"))
    slack_app_token: SecretStr | None = Field(None, validation_alias=_env("SLACK_APP_TOKEN"))
    slack_api_base_url: str | None = Field(None, validation_alias=_env("SLACK_API_BASE_URL"))
    slack_allowed_users: str = Field("", validation_alias=_env("SLACK_ALLOWED_USERS"))
    slack_allowed_channels: str = Field("", validation_alias=_env("SLACK_ALLOWED_CHANNELS"))

    # -- provider -----------------------------------------------------------------------------
    provider: ProviderName = Field("auto", validation_alias=_env("GATEWAY_PROVIDER"))
    model: str | None = Field(None, validation_alias=_env("GATEWAY_MODEL"))
    max_tokens: int = Field(1024, ge=1, validation_alias=_env("GATEWAY_MAX_TOKENS"))
    temperature: float | None = Field(None, validation_alias=_env("GATEWAY_TEMPERATURE"))
    provider_timeout: float = Field(60.0, gt=0, validation_alias=_env("GATEWAY_PROVIDER_TIMEOUT"))
    provider_retries: int = Field(2, ge=0, validation_alias=_env("GATEWAY_PROVIDER_RETRIES"))
    # A provider whose key is refused or that cannot be reached at start: start anyway,
    # degraded (/healthz says why), instead of exiting 2 (app/provider_check.py).
    start_offline_ok: bool = Field(False, validation_alias=_env("GATEWAY_START_OFFLINE_OK"))
    stream: bool = Field(True, validation_alias=_env("GATEWAY_STREAM"))
    anthropic_api_key: SecretStr | None = Field(None, validation_alias=_env("ANTHROPIC_API_KEY"))
    anthropic_base_url: str | None = Field(None, validation_alias=_env("ANTHROPIC_BASE_URL"))
    openai_api_key: SecretStr | None = Field(None, validation_alias=_env("OPENAI_API_KEY"))
    openai_base_url: str | None = Field(None, validation_alias=_env("OPENAI_BASE_URL"))
    openai_max_tokens_field: Literal["max_completion_tokens", "max_tokens"] = Field(
        "max_completion_tokens", validation_alias=_env("OPENAI_MAX_TOKENS_FIELD"))
    openai_reasoning_effort: ReasoningEffort | None = Field(
        None, validation_alias=_env("OPENAI_REASONING_EFFORT"))
    prompt_cache: bool = Field(True, validation_alias=_env("GATEWAY_PROMPT_CACHE"))
    prices_file: Path | None = Field(None, validation_alias=_env("GATEWAY_PRICES_FILE"))
    # Tried in order when the provider is unavailable (5xx, overloaded) after its retries.
    fallbacks: str = Field("", validation_alias=_env("GATEWAY_FALLBACKS"))
    compaction: bool = Field(True, validation_alias=_env("GATEWAY_COMPACTION"))
    # -- budgets and rate limits (0: off) ------------------------------------------------------
    budget_user_tokens: int = Field(0, ge=0, validation_alias=_env("GATEWAY_BUDGET_USER_TOKENS"))
    budget_user_usd: float = Field(0.0, ge=0, validation_alias=_env("GATEWAY_BUDGET_USER_USD"))
    budget_tenant_tokens: int = Field(0, ge=0,
                                      validation_alias=_env("GATEWAY_BUDGET_TENANT_TOKENS"))
    budget_tenant_usd: float = Field(0.0, ge=0,
                                     validation_alias=_env("GATEWAY_BUDGET_TENANT_USD"))
    rate_limit_messages: int = Field(0, ge=0,
                                     validation_alias=_env("GATEWAY_RATE_LIMIT_MESSAGES"))
    rate_limit_seconds: float = Field(60.0, gt=0,
                                      validation_alias=_env("GATEWAY_RATE_LIMIT_SECONDS"))

    # -- schedules: reminders, operators' schedules, heartbeats (gateway.schedule) ---------------
    timezone: str = Field("UTC", validation_alias=_env("GATEWAY_TIMEZONE"))
    # TENANT=ZONE pairs (T0123=Europe/Berlin,default=America/New_York): a tenant's default zone.
    tenant_timezones: str = Field("", validation_alias=_env("GATEWAY_TENANT_TIMEZONES"))
    schedule_grace: float = Field(3600.0, ge=0, validation_alias=_env("GATEWAY_SCHEDULE_GRACE"))
    schedule_max_per_owner: int = Field(25, ge=0,
                                        validation_alias=_env("GATEWAY_SCHEDULE_MAX_PER_OWNER"))
    schedule_max_per_tenant: int = Field(
        2000, ge=0, validation_alias=_env("GATEWAY_SCHEDULE_MAX_PER_TENANT"))
    schedule_min_interval: float = Field(
        300.0, ge=0, validation_alias=_env("GATEWAY_SCHEDULE_MIN_INTERVAL"))
    schedule_poll: float = Field(1.0, gt=0, le=60, validation_alias=_env("GATEWAY_SCHEDULE_POLL"))
    schedule_batch: int = Field(200, ge=1, le=10_000,
                                validation_alias=_env("GATEWAY_SCHEDULE_BATCH"))
    schedule_per_minute: int = Field(0, ge=0, validation_alias=_env("GATEWAY_SCHEDULE_PER_MINUTE"))
    # A JSON list of {"tenant", "conversation" (CHANNEL:CHAT), "minutes", "instruction"}.
    heartbeats: str = Field("", validation_alias=_env("GATEWAY_HEARTBEATS"))

    @field_validator("timezone")
    @classmethod
    def _zone_name(cls, value: str) -> str:
        return _checked_zone(value)

    @field_validator("tenant_timezones")
    @classmethod
    def _tenant_zones(cls, value: str) -> str:
        zone_pairs(value)
        return value

    @property
    def tenant_zone_map(self) -> dict[str, str]:
        return zone_pairs(self.tenant_timezones)

    @field_validator("channels")
    @classmethod
    def _known_channels(cls, value: str) -> str:
        known = {"web", "telegram", "slack"}
        names = [c.strip() for c in value.split(",") if c.strip()]
        unknown = [c for c in names if c not in known]
        if unknown:
            raise ValueError(f"unknown channel(s) {', '.join(unknown)}; known: {sorted(known)}")
        return ",".join(names)

    @field_validator("retention_tenants")
    @classmethod
    def _retention(cls, value: str) -> str:
        if value.strip():
            from sessions.retention import RetentionPolicy  # only when set: start-up is light

            RetentionPolicy.parse(0, value)
        return value

    @property
    def retention(self) -> RetentionPolicy:
        """``GATEWAY_RETENTION_DAYS`` and ``GATEWAY_RETENTION_TENANTS``."""
        from sessions.retention import RetentionPolicy

        return RetentionPolicy.parse(self.retention_days, self.retention_tenants)

    @field_validator("max_concurrent_turns")
    @classmethod
    def _turn_limit(cls, value: int | str) -> int | str:
        if value != "auto" and (not isinstance(value, int) or value < 1):
            raise ValueError("give a number of turns (at least 1) or auto")
        return value

    @property
    def turn_limit(self) -> int | None:
        """``GATEWAY_MAX_CONCURRENT_TURNS`` as a number, or ``None`` for auto."""
        return None if self.max_concurrent_turns == "auto" else int(self.max_concurrent_turns)

    @field_validator("log_level")
    @classmethod
    def _level_name(cls, value: str) -> str:
        if value.strip().upper() not in logging.getLevelNamesMapping():
            raise ValueError("give DEBUG, INFO, WARNING, ERROR or CRITICAL")
        return value.strip().upper()

    @field_validator("log_levels")
    @classmethod
    def _logger_levels(cls, value: str) -> str:
        parse_levels(value)
        return value

    @field_validator("admin_token")
    @classmethod
    def _random_enough(cls, value: SecretStr | None) -> SecretStr | None:
        """The admin token opens every tenant's transcripts, and its sign-in is not locked
        for the right token (so an attacker cannot lock the operator out): it must be a long
        random string. Never echoed."""
        if value is None or not value.get_secret_value():
            return None
        token = value.get_secret_value()
        if len(token) < MIN_ADMIN_TOKEN_CHARS or len(set(token)) < MIN_ADMIN_TOKEN_DISTINCT:
            raise ValueError(
                f"must be at least {MIN_ADMIN_TOKEN_CHARS} random characters (for example: "
                "python3 -c 'import secrets; print(secrets.token_urlsafe(32))')")
        return value

    @field_validator("web_tenant")
    @classmethod
    def _web_tenant(cls, value: str) -> str:
        return validate_tenant(value)

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, value: str) -> str:
        TrustedProxies.parse(value)
        return value

    @field_validator("web_token", "metrics_token")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value():
            return None
        if len(value.get_secret_value()) < MIN_TOKEN_CHARS:
            # Never echo it. These tokens guard HTTP endpoints anyone can reach: short ones
            # can be guessed.
            raise ValueError(f"must be at least {MIN_TOKEN_CHARS} characters long (for "
                             "example: python3 -c 'import secrets; print(secrets.token_hex(16))')")
        return value

    @field_validator("fallbacks")
    @classmethod
    def _fallback_list(cls, value: str) -> str:
        for item in (v.strip() for v in value.split(",") if v.strip()):
            name, sep, model = item.partition(":")
            if not sep or name.strip() not in FALLBACK_PROVIDERS or not model.strip():
                raise ValueError(f"{item!r}: give provider:model, provider one of "
                                 f"{', '.join(FALLBACK_PROVIDERS)}")
        return value

    @property
    def fallback_list(self) -> list[tuple[str, str]]:
        """``GATEWAY_FALLBACKS`` as (provider, model) pairs, in order."""
        pairs = (v.strip().partition(":") for v in self.fallbacks.split(",") if v.strip())
        return [(name.strip(), model.strip()) for name, _, model in pairs]

    @field_validator("store_url")
    @classmethod
    def _postgres_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value():
            return None
        if not value.get_secret_value().startswith(("postgresql://", "postgres://")):
            raise ValueError("must be a postgresql:// URL")  # never echo it: it may hold a password
        return value

    @field_validator("store_schema")
    @classmethod
    def _schema_name(cls, value: str) -> str:
        return pg_schema.validate_schema(value)

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value():
            return None
        if not value.get_secret_value().startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")  # never echo it
        return value

    @property
    def channel_names(self) -> list[str]:
        return [c for c in self.channels.split(",") if c]

    @staticmethod
    def id_list(value: str) -> frozenset[str]:
        """A comma-separated allowlist setting as a set (ids or @usernames, trimmed)."""
        return frozenset(v.strip() for v in value.split(",") if v.strip())

    @property
    def max_request_bytes(self) -> int:
        """The HTTP body limit: one attachment at the size limit, base64-encoded, plus room
        for the rest of the request (at least 2 MiB)."""
        return max(2 * 1024 * 1024, self.max_attachment_bytes * 4 // 3 + 1024 * 1024)

    @property
    def persona_root(self) -> Path:
        return self.persona_dir or self.data_dir / "persona"

    def traces_endpoint(self) -> str | None:
        """Where live traces go (OTLP/HTTP), or None when tracing is off."""
        if self.otel_sdk_disabled or self.otel_traces_exporter.strip().lower() == "none":
            return None
        if self.otel_traces_endpoint:
            return self.otel_traces_endpoint
        if self.otel_endpoint:  # the base endpoint: the signal's path is added (OTLP spec)
            return self.otel_endpoint.rstrip("/") + "/v1/traces"
        return None

    def provider_server(self) -> tuple[str | None, int | None]:
        """Host and port the provider's API is reached at (``server.address`` on spans)."""
        name = self.resolved_provider()
        base = {"anthropic": self.anthropic_base_url or "https://api.anthropic.com",
                "openai": self.openai_base_url or "https://api.openai.com/v1"}.get(name)
        if base is None:
            return None, None
        parts = urlsplit(base)
        try:
            port = parts.port
        except ValueError:
            port = None
        return parts.hostname, port or (443 if parts.scheme == "https" else 80)

    def resolved_provider(self) -> str:
        """``auto`` picks anthropic, then openai, when a key is set; else offline."""
        if self.provider != "auto":
            return self.provider
        if self.anthropic_api_key is not None:
            return "anthropic"
        if self.openai_api_key is not None or self.openai_base_url:
            return "openai"
        return "offline"

    def secrets(self) -> list[str]:
        """Every configured secret value, for the log redaction filter."""
        values = []
        for name, field in type(self).model_fields.items():
            value = getattr(self, name)
            if isinstance(value, SecretStr) and value.get_secret_value():
                values.append(value.get_secret_value())
            del field
        for url in (self.store_url, self.redis_url):
            if url is None:
                continue
            password = urlsplit(url.get_secret_value()).password
            if password:
                values.extend({password, unquote(password)})
        return values
