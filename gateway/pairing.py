"""DM pairing: how an unknown person gets approved to talk to the agent.

An unknown user who writes in a direct message gets an 8-character code (valid one hour) and
is told to ask the operator, who runs ``gateway pairing approve CODE``. Codes are drawn from an
alphabet without look-alike characters, stored 0600 under ``<data>/access/`` and never logged.
Approving a wrong code counts as a bad attempt; after 5 bad attempts within the hour, approval
is locked for an hour (codes are short, so guessing must stay expensive).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.state_file import read_json, write_json

ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
CODE_LENGTH = 8
CODE_TTL = 3600.0
MAX_BAD_ATTEMPTS = 5
LOCKOUT = 3600.0


class PairingError(Exception):
    """An approve/revoke that cannot be done; the message is safe to print."""


@dataclass(frozen=True, slots=True)
class PendingRequest:
    code: str
    channel: str
    user: str
    name: str | None
    created: float


class PairingStore:
    """Pending codes and approved users, in ``<data_dir>/access/pairing.json``.

    The file is re-read on every operation so that the CLI (another process) and the running
    gateway see each other's changes; writes are atomic.
    """

    def __init__(self, data_dir: Path, clock: Callable[[], float] = time.time) -> None:
        self.path = data_dir / "access" / "pairing.json"
        self.clock = clock

    def _load(self) -> dict[str, Any]:
        data = read_json(self.path, {})
        data.setdefault("pending", {})
        data.setdefault("approved", {})
        data.setdefault("bad_attempts", [])
        data.setdefault("locked_until", 0.0)
        now = self.clock()
        data["pending"] = {c: p for c, p in data["pending"].items()
                           if now - p["created"] < CODE_TTL}
        data["bad_attempts"] = [t for t in data["bad_attempts"] if now - t < CODE_TTL]
        return data

    def is_approved(self, channel: str, user: str) -> bool:
        return f"{channel}:{user}" in self._load()["approved"]

    def request(self, channel: str, user: str, name: str | None) -> str:
        """The pending code for this user (the same one while it is valid), creating one."""
        data = self._load()
        for code, pending in data["pending"].items():
            if pending["channel"] == channel and pending["user"] == user:
                return str(code)
        code = "".join(secrets.choice(ALPHABET) for _ in range(CODE_LENGTH))
        data["pending"][code] = {"channel": channel, "user": user, "name": name,
                                 "created": self.clock()}
        write_json(self.path, data)
        return code

    def approve(self, code: str) -> PendingRequest:
        data = self._load()
        now = self.clock()
        if data["locked_until"] > now:
            raise PairingError("too many bad codes; approval is locked for up to an hour")
        pending = data["pending"].pop(code.strip().upper(), None)
        if pending is None:
            data["bad_attempts"].append(now)
            if len(data["bad_attempts"]) >= MAX_BAD_ATTEMPTS:
                data["locked_until"] = now + LOCKOUT
                data["bad_attempts"] = []
            write_json(self.path, data)
            raise PairingError("no such pending code (codes expire after an hour)")
        data["approved"][f"{pending['channel']}:{pending['user']}"] = {
            "name": pending.get("name"), "approved": now,
        }
        write_json(self.path, data)
        return PendingRequest(code, pending["channel"], pending["user"], pending.get("name"),
                              pending["created"])

    def revoke(self, channel: str, user: str) -> None:
        data = self._load()
        if data["approved"].pop(f"{channel}:{user}", None) is None:
            raise PairingError(f"{channel}:{user} is not approved")
        write_json(self.path, data)

    def listing(self) -> dict[str, Any]:
        """Pending requests (codes hidden except to the operator's CLI) and approved users."""
        data = self._load()
        return {"pending": data["pending"], "approved": data["approved"],
                "locked": data["locked_until"] > self.clock()}
