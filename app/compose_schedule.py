"""The composition root, schedule half: reminders and heartbeats from settings.

Where schedules are kept (beside the sessions), the ``GATEWAY_SCHEDULE_*`` settings, the
operator's heartbeats and the check that a schedule's tenant can be reached in its channel.
Kept apart from :mod:`app.compose` because ``gateway schedule`` and ``gateway forget`` use
them without building a gateway.
"""

from __future__ import annotations

import sys

from app.config import Settings
from gateway.edge.errors import ConfigError
from gateway.schedule import heartbeat
from gateway.schedule.service import ScheduleSettings
from gateway.schedule.store import ScheduleStore
from sessions.schedule_file import FileScheduleStore
from sessions.store import SessionStore


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
