"""Who is talking on the web chat: an identity the server issues, never one the client names.

Per-person limits, budgets, ``/usage`` and the memory scope of a one-to-one chat are keyed on
the person (the message's sender id). On the web that used to be the conversation id, which
the client chooses: a new id with every message was a new person each time, past every
per-person limit. The person is now one of:

* with ``GATEWAY_WEB_TOKEN``: **the token's user**, ``t-<12 hex>`` (a hash of the token, never
  the token): everyone who holds the token is one person (give people different gateways or
  the platforms' own accounts when they must be counted apart);
* without a token (the API answers only this machine, or clients a trusted proxy forwards):
  **the browser**, ``c-<id>``, from the ``gateway_web`` cookie the chat page sets: a random id
  signed with the gateway's key (HMAC-SHA256; ``HttpOnly``, ``SameSite=Strict``), checked on
  every request; or, for a request without a valid cookie (an API client, a cleared cookie),
  **its address**, ``a-<16 hex>`` (an HMAC of the client address, so no address is written
  anywhere): every cookie-less client behind one address is one person, so the per-person
  limits are per-address limits for them. An address is given at most
  :data:`NEW_PER_ADDRESS` new cookies per :data:`NEW_WINDOW` seconds: clearing cookies to
  start over as a new person runs out quickly, and then the address is the person.

The key is the gateway's (``<data>/state/web-identity.key``, made on first start, 0600), so an
identity outlives a restart; workers that share a Redis agree on one key there (and each writes
it to its own file: ``coordination.shared_key``), so a browser is one person, with one set of
conversations, on every worker.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

COOKIE: Final = "gateway_web"
COOKIE_MAX_AGE: Final = 400 * 24 * 3600
"""The longest lifetime browsers keep a cookie for (400 days)."""
NEW_PER_ADDRESS: Final = 20
NEW_WINDOW: Final = 3600.0
MAX_ADDRESSES: Final = 10_000


@dataclass(frozen=True, slots=True)
class Identity:
    """The person a request counts as, and the cookie to set on the answer (if any)."""

    person: str
    cookie: str | None = None


class WebIdentities:
    """Issues and checks web identities (module docstring)."""

    def __init__(self, key: bytes, *, token: bytes | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if len(key) < 16:
            raise ValueError("the web identity key must be at least 16 bytes")
        self._key = key
        self._token_person = (f"t-{hashlib.sha256(token).hexdigest()[:12]}"
                              if token is not None else None)
        self._clock = clock
        self._issued: OrderedDict[str, list[float]] = OrderedDict()

    def of(self, cookie: str | None, address: str) -> str:
        """The person an API request is: the token's user, the cookie's browser, or the
        client's address."""
        if self._token_person is not None:
            return self._token_person
        browser = self._checked(cookie)
        return browser if browser is not None else self._address(address)

    def for_page(self, cookie: str | None, address: str) -> Identity:
        """The person loading the chat page, with a new cookie when it has no valid one and
        its address may still be given one."""
        person = self.of(cookie, address)
        if self._token_person is not None or person.startswith("c-"):
            return Identity(person)
        if not self._may_issue(address):
            return Identity(person)
        browser = secrets.token_urlsafe(12)
        return Identity(f"c-{browser}", f"{browser}.{self._mac(browser)}")

    def _checked(self, cookie: str | None) -> str | None:
        browser, _, mac = (cookie or "").partition(".")
        if not browser or len(browser) > 32 or not browser.isascii():
            return None
        if not hmac.compare_digest(mac.encode("ascii", "replace"),
                                   self._mac(browser).encode("ascii")):
            return None
        return f"c-{browser}"

    def _address(self, address: str) -> str:
        digest = hmac.new(self._key, b"gateway-web-address:" + address.encode(
            "utf-8", "surrogateescape"), hashlib.sha256).hexdigest()
        return f"a-{digest[:16]}"

    def _mac(self, browser: str) -> str:
        return hmac.new(self._key, b"gateway-web-browser:" + browser.encode(),
                        hashlib.sha256).hexdigest()[:32]

    def _may_issue(self, address: str) -> bool:
        now = self._clock()
        recent = [t for t in self._issued.pop(address, []) if now - t < NEW_WINDOW]
        allowed = len(recent) < NEW_PER_ADDRESS
        if allowed:
            recent.append(now)
        self._issued[address] = recent
        while len(self._issued) > MAX_ADDRESSES:
            self._issued.popitem(last=False)
        return allowed
