"""Redis key names and the wire form of queued items (pure: no I/O).

Every key starts with the configured prefix (``GATEWAY_REDIS_PREFIX``, default ``gw:``), so
several deployments, or the test suite's throw-away prefixes, share one Redis::

    {p}conv:{<tenant>:<conversation>}:lease     ``<worker>/<n>``: the id of the worker serving
                                                it and the number of its claim (PX ttl)
    {p}inbox:<worker>                           replies relayed to the worker holding the
                                                request (expires INBOX_TTL after the last)
    {p}leader:<job>                             owner id of the elected worker (PX ttl)
    {p}pairing                                  the pairing document (JSON)
    {p}web-identity-key                         the web identity key the workers agreed on
                                                (base64; :mod:`coordination.shared_key`)

Every key but the pairing document and the web identity key expires by itself. What is owed
(the queues, the dedup of platform ids) and the fencing tokens are in PostgreSQL, not here:
Redis losing its state loses leases and relayed reply events, never a message (see
:mod:`coordination.redis_queue`). The braces are Redis Cluster hash tags (a conversation's
keys share a slot).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.edge.coordination import QueueItem
from gateway.edge.messages import Attachment, ConversationKey, Inbound, Sender

DEFAULT_PREFIX = "gw:"


@dataclass(frozen=True, slots=True)
class Keys:
    """Key names under one prefix."""

    prefix: str = DEFAULT_PREFIX

    def _conv(self, key: ConversationKey, part: str) -> str:
        return f"{self.prefix}conv:{{{key.tenant}:{key.label()}}}:{part}"

    def lease(self, key: ConversationKey) -> str:
        return self._conv(key, "lease")

    def inbox(self, worker: str) -> str:
        return f"{self.prefix}inbox:{worker}"

    def leader(self, job: str) -> str:
        return f"{self.prefix}leader:{job}"

    @property
    def pairing(self) -> str:
        return f"{self.prefix}pairing"

    @property
    def web_identity_key(self) -> str:
        return f"{self.prefix}web-identity-key"


def member(key: ConversationKey) -> str:
    """A conversation as one string (the whole key, so :func:`key_of` rebuilds it): how the
    owed journal and the inbox name a conversation."""
    return orjson.dumps([key.channel, key.chat, key.tenant, key.thread]).decode()


def key_of(value: str) -> ConversationKey:
    channel, chat, tenant, thread = orjson.loads(value)
    return ConversationKey(str(channel), str(chat), str(tenant),
                           None if thread is None else str(thread))


@dataclass(frozen=True, slots=True)
class WireItem:
    """A queued item as read back: who received it and whether it waits for a relay."""

    item: QueueItem
    origin: str
    relay: bool


def encode_item(item: QueueItem, origin: str) -> str:
    """``<id> <json>``: the id first, then the item (the form the journals store)."""
    inbound = item.inbound
    body = {
        "kind": item.kind,
        "origin": origin,
        "relay": item.sink is not None,
        "key": [inbound.key.channel, inbound.key.chat, inbound.key.tenant, inbound.key.thread],
        "sender": [inbound.sender.id, inbound.sender.name],
        "text": inbound.text,
        "platform_id": inbound.platform_id,
        "chat_type": inbound.chat_type,
        "received_at": inbound.received_at,
        "meta": dict(inbound.meta),
    }
    # Attachments are taken in (stored as blobs) before a message is queued, and only their
    # references travel, never their bytes; except files fetched after the acknowledgement
    # (gateway.edge.messages.deferred), which travel as what the channel said of them, so that
    # whoever serves the item (a restarted process, another worker) can still fetch them.
    if inbound.attachments:
        body["attachments"] = [_attachment(a) for a in inbound.attachments]
    if inbound.parts:
        body["parts"] = [dict(p) for p in inbound.parts]
    if inbound.notice is not None:
        body["notice"] = inbound.notice
    # Channel meta is plain data; anything else is kept as text rather than refused.
    return f"{item.id} {orjson.dumps(body, default=str).decode()}"


def decode_item(raw: str, *, resumed: bool = False) -> WireItem:
    item_id, _, text = raw.partition(" ")
    body: dict[str, Any] = orjson.loads(text)
    channel, chat, tenant, thread = body["key"]
    sender_id, sender_name = body["sender"]
    inbound = Inbound(
        key=ConversationKey(channel, chat, tenant, thread),
        sender=Sender(sender_id, sender_name),
        text=body["text"],
        platform_id=body.get("platform_id"),
        chat_type=body.get("chat_type", "private"),
        received_at=float(body.get("received_at") or 0.0),
        meta=body.get("meta") or {},
        attachments=tuple(_attachment_of(a) for a in body.get("attachments") or ()),
        parts=tuple(body.get("parts") or ()),
        notice=body.get("notice"),
    )
    item = QueueItem(inbound, kind=body.get("kind", "message"), id=item_id, resumed=resumed)
    return WireItem(item, str(body.get("origin", "")), bool(body.get("relay")))


def _attachment(attachment: Attachment) -> dict[str, Any]:
    # Only files fetched after the acknowledgement are queued before they are taken in.
    assert not attachment.data, "an attachment's bytes never travel"
    assert attachment.fetch is None, "a file fetched before recording is taken in first"
    return {"name": attachment.name, "media_type": attachment.media_type,
            "kind": attachment.kind, "size": attachment.size, "problem": attachment.problem,
            "ref": None if attachment.ref is None else dict(attachment.ref)}


def _attachment_of(raw: dict[str, Any]) -> Attachment:
    ref = raw.get("ref")
    size = raw.get("size")
    return Attachment(str(raw.get("name") or "file"),
                      str(raw.get("media_type") or "application/octet-stream"),
                      kind=str(raw.get("kind") or "file"),
                      size=size if isinstance(size, int) else None,
                      problem=raw.get("problem"),
                      ref={str(k): str(v) for k, v in ref.items()}
                      if isinstance(ref, dict) else None)
