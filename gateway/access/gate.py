"""Access control, before anything reaches the router.

Per channel: an allowlist of users (ids or @usernames) and of group chats/channels, plus DM
pairing for people not on the list. A refused message never reaches the agent loop and leaves
no session; a person refused in a DM is told how to get paired (the code goes only to them).
Channels with no allowlist and pairing off are open; web and console are local and governed by
their own token instead. An inbound that carries a ``refusal`` (content the channel will not
pass on) is decided like any other and then answered with that text, never recorded: a
stranger learns nothing about what the gateway accepts.

A stranger hears the pairing text once per :data:`PAIRING_REPLY_WINDOW`: their other messages
in that time are refused in silence (each reply is a message the bot sends on the platform's
rate limits, so a stranger writing fast, or many, must not make it send one per message). The
window is remembered per gateway process, for at most :data:`MAX_QUIET` people (the oldest
forgotten first); with several workers a stranger may hear it once from each.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from gateway.edge.channel import Deliver, ReplySink
from gateway.edge.messages import Inbound
from gateway.edge.metrics import Metrics

log = logging.getLogger(__name__)

PAIRING_TEXT = (
    "Hi! I don't know you yet. To talk to me, ask my operator to run:\n\n"
    "{command} {code}\n\nThis code is valid for one hour."
)

PAIRING_REPLY_WINDOW: Final = 600.0
"""Seconds during which a stranger who was sent the pairing text is not sent it again."""
MAX_QUIET: Final = 10_000


@dataclass(frozen=True, slots=True)
class ChannelRules:
    users: frozenset[str] = frozenset()
    chats: frozenset[str] = frozenset()
    pairing: bool = True
    restricted: bool = True
    """False for an open channel (no allowlist, no pairing): everyone may talk."""


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str
    reply: str | None = None


class Pairing(Protocol):
    """DM pairing as access control asks it (:class:`gateway.access.pairing_live.LivePairing`).

    Contract: :meth:`is_approved` answers from memory (no I/O: it runs on every message).
    :meth:`check` returns None for an approved person, else their pending code (created if
    needed), on record before it is returned; it may wait on I/O, never block the loop.
    """

    def is_approved(self, channel: str, user: str) -> bool: ...

    async def check(self, channel: str, user: str, name: str | None) -> str | None: ...


@dataclass
class AccessPolicy:
    rules: Mapping[str, ChannelRules]
    pairing: Pairing | None
    unrestricted: frozenset[str] = field(default_factory=lambda: frozenset({"web", "console",
                                                                             "memory"}))
    approve_command: str = "gateway pairing approve"
    """What the operator runs with the code, as they type it on the gateway's machine."""

    async def decide(self, inbound: Inbound) -> Decision:
        channel = inbound.key.channel
        if channel in self.unrestricted:
            return Decision(True, "local")
        rules = self.rules.get(channel, ChannelRules())
        if not rules.restricted:
            return Decision(True, "open")
        sender = inbound.sender
        names = {sender.id}
        if inbound.meta.get("username"):
            names.add(f"@{inbound.meta['username']}")
        if names & rules.users:
            return Decision(True, "allowlist")
        if inbound.chat_type != "private":
            if inbound.key.chat in rules.chats:
                return Decision(True, "chat-allowlist")
            return Decision(False, "not-allowed-group")
        if self.pairing is not None and rules.pairing:
            if self.pairing.is_approved(channel, sender.id):
                return Decision(True, "paired")
            code = await self.pairing.check(channel, sender.id, sender.name)
            if code is None:
                return Decision(True, "paired")
            return Decision(False, "pairing",
                            PAIRING_TEXT.format(command=self.approve_command, code=code))
        return Decision(False, "not-allowed")


Notify = Callable[[Inbound, str, ReplySink | None], Awaitable[None]]


class AccessGate:
    """Wraps the router's ``deliver``: only allowed messages pass; refusals are counted."""

    def __init__(self, policy: AccessPolicy, deliver: Deliver, notify: Notify,
                 metrics: Metrics, *, reply_window: float = PAIRING_REPLY_WINDOW,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self._deliver = deliver
        self._notify = notify
        self._metrics = metrics
        self._window = reply_window
        self._clock = clock
        self._told: OrderedDict[tuple[str, str, str], float] = OrderedDict()
        """(tenant, channel, person) -> when they were last sent the pairing text."""

    async def deliver(self, inbound: Inbound, sink: ReplySink | None = None) -> object:
        decision = await self.policy.decide(inbound)
        if decision.allowed and inbound.refusal is not None:
            # Content checks come after access control: only an admitted sender hears why.
            self._metrics.refused.labels(channel=inbound.key.channel, reason="content").inc()
            await self._notify(inbound, inbound.refusal, sink)
            return None
        if decision.allowed:
            return await self._deliver(inbound, sink)
        self._metrics.refused.labels(channel=inbound.key.channel, reason=decision.reason).inc()
        log.info("refused a %s message from an unknown user (%s)", inbound.key.channel,
                 decision.reason)
        if decision.reply is not None and self._tell(inbound):
            await self._notify(inbound, decision.reply, sink)
        return None

    def _tell(self, inbound: Inbound) -> bool:
        """Whether this stranger is to be told (not told within the window); notes it."""
        key = (inbound.key.tenant, inbound.key.channel, inbound.sender.id)
        now = self._clock()
        last = self._told.get(key)
        if last is not None and now - last < self._window:
            return False
        self._told.pop(key, None)
        self._told[key] = now
        while len(self._told) > MAX_QUIET:
            self._told.popitem(last=False)
        return True
