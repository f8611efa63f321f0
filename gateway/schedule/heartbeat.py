"""The heartbeat: an instruction the agent is given every N minutes in a configured
conversation of a tenant, so it can act without being spoken to (off by default).

``GATEWAY_HEARTBEATS`` is a JSON list, one object per tenant::

    [{"tenant": "T0123", "conversation": "slack:C0456", "minutes": 60,
      "instruction": "Look at the open questions in this channel and follow up."}]

Each becomes an operator schedule with a fixed id (``hb-`` and a hash of tenant and
conversation), put in the store at start (so every worker puts the same one; an unchanged
heartbeat keeps its next time), and one no longer configured is cancelled. It fires like any
schedule: once per occurrence, recorded like any turn.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.schedule.service import TENANT_OWNER
from gateway.schedule.store import ScheduleStore
from sessions.names import DEFAULT_TENANT
from sessions.schedules import ScheduleRecord, Target

CREATED_BY = "operator:heartbeat"


@dataclass(frozen=True, slots=True)
class Heartbeat:
    tenant: str
    channel: str
    chat: str
    minutes: float
    instruction: str
    chat_type: str = "group"


def parse(text: str) -> list[Heartbeat]:
    """``GATEWAY_HEARTBEATS`` read; ``ValueError`` naming what is wrong."""
    if not text.strip():
        return []
    try:
        items: Any = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"GATEWAY_HEARTBEATS is not JSON ({exc})") from exc
    if not isinstance(items, list):
        raise ValueError("GATEWAY_HEARTBEATS is a JSON list of objects")
    found = []
    for n, item in enumerate(items, 1):
        if not isinstance(item, dict):
            raise ValueError(f"GATEWAY_HEARTBEATS item {n} is not an object")
        channel, sep, chat = str(item.get("conversation", "")).partition(":")
        minutes, instruction = item.get("minutes"), item.get("instruction")
        if not sep or not channel or not chat:
            raise ValueError(f"GATEWAY_HEARTBEATS item {n}: conversation is CHANNEL:CHAT")
        if not isinstance(minutes, int | float) or minutes < 1:
            raise ValueError(f"GATEWAY_HEARTBEATS item {n}: minutes is a number >= 1")
        if not isinstance(instruction, str) or not instruction.strip():
            raise ValueError(f"GATEWAY_HEARTBEATS item {n}: instruction is required")
        private = item.get("private") is True
        found.append(Heartbeat(str(item.get("tenant") or DEFAULT_TENANT), channel, chat,
                               float(minutes), " ".join(instruction.split()),
                               "private" if private else "group"))
    return found


def heartbeat_id(tenant: str, channel: str, chat: str) -> str:
    digest = hashlib.sha256(f"{tenant}\0{channel}\0{chat}".encode()).hexdigest()[:10]
    return f"hb-{digest}"


def record_of(beat: Heartbeat, now: float, zone: str) -> ScheduleRecord:
    interval = beat.minutes * 60
    private = beat.chat_type == "private"
    return ScheduleRecord(
        id=heartbeat_id(beat.tenant, beat.channel, beat.chat), tenant=beat.tenant,
        owner=TENANT_OWNER, target=Target(beat.channel, beat.chat, beat.chat_type, None,
                                          beat.chat if private else None),
        trigger="every", spec=repr(interval), zone=zone, instruction=beat.instruction,
        created_by=CREATED_BY, created_at=now, start=now + interval, next_at=now + interval)


async def ensure(store: ScheduleStore, beats: Sequence[Heartbeat], now: float,
                 zone: str = "UTC") -> None:
    """Put every configured heartbeat in the store; cancel those no longer configured."""
    wanted = {heartbeat_id(b.tenant, b.channel, b.chat): b for b in beats}
    for record in await store.find(None):
        if record.created_by == CREATED_BY and record.id not in wanted:
            await store.cancel(record.tenant, record.id)
    for ident, beat in wanted.items():
        fresh = record_of(beat, now, zone)
        current = await store.get(beat.tenant, ident)
        if current is not None and current.active and current.spec == fresh.spec \
                and current.instruction == fresh.instruction:
            continue  # unchanged: its next time stays
        if current is not None and current.firing is not None:
            fresh = dataclasses.replace(fresh, firing=current.firing)  # still owed
        await store.put(fresh)
