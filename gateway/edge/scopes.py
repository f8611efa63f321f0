"""Whose text is whose: the memory scope of a conversation, and scope names safe as paths.

The persona is read from three layers (the table is in ``docs/architecture.md``, "Scopes"):
the **operator** layer and a **tenant** layer, written by the operator only, and the **memory
scope** of the conversation, where everything the model's tools write goes:

* a one-to-one conversation (``chat_type == "private"``: a Telegram private chat, a Slack DM,
  a web or console conversation) has the scope of the **person**: tenant + channel + their
  platform user id;
* a shared conversation (a Telegram group or forum topic, a Slack channel, its threads, a
  group DM) has the scope of the **chat**: tenant + channel + chat id (a topic or thread shares
  its chat's scope). Never a member's personal scope: what someone said in private never
  reaches a group, and what a group said never reaches one member's private memory.

A call's prompt holds the operator layer, its tenant's layer and its scope's memory, nothing
else. Platform ids become path segments only through :func:`segment`: an id that is a safe
name (:func:`gateway.edge.ids.valid_id`) is used as it is, anything else as ``_`` + a SHA-256 hex
prefix. Safe names never start with ``_``, so the mapping stays one-to-one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Final, Literal

from gateway.edge.ids import InvalidIdError, valid_id
from gateway.edge.messages import ChannelContext

ScopeKind = Literal["person", "chat"]

ONE_TO_ONE: Final = "private"
"""The chat type of a one-to-one conversation (channels map DMs to it)."""

KIND_DIRS: Final[Mapping[ScopeKind, str]] = {"person": "people", "chat": "chats"}
HASH_CHARS: Final = 32
MAX_ID_CHARS: Final = 256
"""Longer ids are refused: no platform has them, and they would only bloat headers."""


class ScopeError(ValueError):
    """A scope that cannot be named (bad tenant, channel or id); the message is safe to show."""


@dataclass(frozen=True, slots=True)
class Scope:
    """One memory scope: a person or a chat, on one channel, in one tenant."""

    tenant: str
    channel: str
    kind: ScopeKind
    id: str

    def __post_init__(self) -> None:
        try:
            valid_id(self.tenant, "tenant")
            valid_id(self.channel, "channel")
        except InvalidIdError as exc:
            raise ScopeError(str(exc)) from exc
        if self.kind not in KIND_DIRS:
            raise ScopeError(f"scope kind must be person or chat, not {self.kind!r}")
        if not isinstance(self.id, str) or len(self.id) > MAX_ID_CHARS:
            raise ScopeError(f"a {self.kind} id is a string of at most {MAX_ID_CHARS} characters")

    @property
    def label(self) -> str:
        """``person:CHANNEL:ID`` or ``chat:CHANNEL:ID`` (the tenant is said separately)."""
        return f"{self.kind}:{self.channel}:{self.id}"

    @property
    def path(self) -> PurePosixPath:
        """Where the scope lives below the memory root: ``TENANT/CHANNEL/people|chats/SEG``."""
        return PurePosixPath(self.tenant, self.channel, KIND_DIRS[self.kind], segment(self.id))

    def header(self) -> dict[str, str]:
        """The ``scope`` field of a session header (the tenant is the header's own)."""
        return {"kind": self.kind, "channel": self.channel, "id": self.id}

    @classmethod
    def from_header(cls, tenant: str, value: Any) -> Scope | None:
        """The scope a session header names, or None (older sessions name none)."""
        if not isinstance(value, Mapping):
            return None
        kind, channel, ident = value.get("kind"), value.get("channel"), value.get("id")
        if not isinstance(channel, str) or not isinstance(ident, str):
            return None
        try:
            if kind == "person":
                return cls(tenant, channel, "person", ident)
            if kind == "chat":
                return cls(tenant, channel, "chat", ident)
        except ScopeError:
            return None
        return None


def segment(value: str) -> str:
    """``value`` as one path segment: itself if it is a safe name, else ``_`` + a hash."""
    try:
        return valid_id(value, "id")
    except InvalidIdError:
        return "_" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_CHARS]


def scope_of(context: ChannelContext) -> Scope:
    """The memory scope of the conversation ``context`` describes (see the module docstring)."""
    if context.chat_type == ONE_TO_ONE:
        return Scope(context.tenant, context.channel, "person", context.person or context.chat)
    return Scope(context.tenant, context.channel, "chat", context.chat)


def parse_ref(text: str, kind: ScopeKind, tenant: str) -> Scope:
    """``CHANNEL:ID`` (as operators type it: ``telegram:1001``, ``slack:U0ABC``) as a scope."""
    channel, sep, ident = text.partition(":")
    if not sep or not channel or not ident:
        raise ScopeError(f"{text[:60]!r} is not CHANNEL:ID (e.g. telegram:1001)")
    return Scope(tenant, channel, kind, ident)
