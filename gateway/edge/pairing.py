"""DM pairing: how an unknown person gets approved to talk to the agent.

An unknown user who writes in a direct message gets an 8-character code (valid one hour) and
is told to ask the operator, who runs ``gateway pairing approve CODE``. Codes are drawn from an
alphabet without look-alike characters, stored 0600 under ``<data>/access/`` and never logged.
Approving a wrong code counts as a bad attempt; after 5 bad attempts within the hour, approval
is locked for an hour (codes are short, so guessing must stay expensive).

At most :data:`MAX_PENDING` codes are pending at once: a flood of strangers makes the oldest
codes expire first (a person whose code went asks again and gets a new one). A person has one
live code at a time: asking again while it is valid gives the same code.

Where the state lives is a seam (:class:`PairingState`): the file above for one gateway, a
Redis key for workers that share one (``GATEWAY_REDIS_URL``). The running gateway decides from
memory and writes behind (:mod:`gateway.access.pairing_live`); ``gateway pairing`` works on the
state
directly.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
CODE_LENGTH = 8
CODE_TTL = 3600.0
MAX_BAD_ATTEMPTS = 5
LOCKOUT = 3600.0
MAX_PENDING = 256
"""Pending codes kept at once; beyond it, the oldest are dropped first."""

T = TypeVar("T")


class PairingError(Exception):
    """An approve/revoke that cannot be done; the message is safe to print."""


@dataclass(frozen=True, slots=True)
class PendingRequest:
    code: str
    channel: str
    user: str
    name: str | None
    created: float


class PairingState(Protocol):
    """Where the pairing document lives (pending codes, approvals, bad attempts).

    Contract: :meth:`read` returns a snapshot (``{}`` when there is none). :meth:`update`
    calls ``change`` on the current document and stores the document as ``change`` left it,
    only if it changed, and returns what ``change`` returned; a ``change`` that raises stores
    nothing. The Redis state applies an update atomically across workers (it retries
    ``change`` on a conflict, so ``change`` must be pure apart from the document); the file
    state is for one gateway and its CLI.
    """

    def read(self) -> dict[str, Any]: ...

    def update(self, change: Callable[[dict[str, Any]], T]) -> T: ...


class PairingStore:
    """Pending codes and approved users, in a :class:`PairingState`.

    One gateway keeps the state in a private file (:mod:`coordination.file_pairing`); workers
    sharing Redis pass the Redis state, so a code given by one worker can be approved while
    another one serves the person.
    """

    def __init__(self, state: PairingState, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.state = state

    def _clean(self, data: dict[str, Any]) -> dict[str, Any]:
        """Fill in missing parts and drop expired codes and attempts (in place)."""
        data.setdefault("pending", {})
        data.setdefault("approved", {})
        data.setdefault("bad_attempts", [])
        data.setdefault("locked_until", 0.0)
        now = self.clock()
        data["pending"] = {c: p for c, p in data["pending"].items()
                           if now - p["created"] < CODE_TTL}
        data["bad_attempts"] = [t for t in data["bad_attempts"] if now - t < CODE_TTL]
        return data

    def _load(self) -> dict[str, Any]:
        # A shallow copy: _clean replaces the parts it filters, never changes the snapshot.
        return self._clean(dict(self.state.read()))

    def is_approved(self, channel: str, user: str) -> bool:
        approved = self.state.read().get("approved")
        return isinstance(approved, dict) and f"{channel}:{user}" in approved

    def pending_code(self, channel: str, user: str) -> str | None:
        """This person's live pending code, if they have one."""
        for code, pending in self._load()["pending"].items():
            if pending["channel"] == channel and pending["user"] == user:
                return str(code)
        return None

    def request(self, channel: str, user: str, name: str | None) -> str:
        """The pending code for this user (the same one while it is valid), creating one."""
        fresh = "".join(secrets.choice(ALPHABET) for _ in range(CODE_LENGTH))

        def change(data: dict[str, Any]) -> str:
            self._clean(data)
            for code, pending in data["pending"].items():
                if pending["channel"] == channel and pending["user"] == user:
                    return str(code)
            pending = data["pending"]
            for code in sorted(pending, key=lambda c: pending[c]["created"])[
                    :max(0, len(pending) - MAX_PENDING + 1)]:
                del pending[code]  # the oldest expire first
            pending[fresh] = {"channel": channel, "user": user, "name": name,
                              "created": self.clock()}
            return fresh

        return self.state.update(change)

    def approve(self, code: str) -> PendingRequest:
        wanted = code.strip().upper()

        def change(data: dict[str, Any]) -> PendingRequest | str:
            """The approved request, or why not (the bad attempt is stored all the same)."""
            self._clean(data)
            now = self.clock()
            if data["locked_until"] > now:
                return "too many bad codes; approval is locked for up to an hour"
            pending = data["pending"].pop(wanted, None)
            if pending is None:
                data["bad_attempts"].append(now)
                if len(data["bad_attempts"]) >= MAX_BAD_ATTEMPTS:
                    data["locked_until"] = now + LOCKOUT
                    data["bad_attempts"] = []
                return "no such pending code (codes expire after an hour)"
            data["approved"][f"{pending['channel']}:{pending['user']}"] = {
                "name": pending.get("name"), "approved": now,
            }
            return PendingRequest(wanted, pending["channel"], pending["user"],
                                  pending.get("name"), pending["created"])

        result = self.state.update(change)
        if isinstance(result, str):
            raise PairingError(result)
        return result

    def revoke(self, channel: str, user: str) -> None:
        def change(data: dict[str, Any]) -> bool:
            self._clean(data)
            return data["approved"].pop(f"{channel}:{user}", None) is not None

        if not self.state.update(change):
            raise PairingError(f"{channel}:{user} is not approved")

    def listing(self) -> dict[str, Any]:
        """Pending requests (codes hidden except to the operator's CLI) and approved users."""
        data = self._load()
        return {"pending": data["pending"], "approved": data["approved"],
                "locked": data["locked_until"] > self.clock()}
