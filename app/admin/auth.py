"""Who may see the viewer, and which tenants they see.

Authentication. With a token configured, a request is let in by ``Authorization: Bearer
<token>`` or by the login cookie; anything else gets 401 (the login form). The cookie holds
``<issued>.<id>.<mac>``: the issue time, a random id of this sign-in, and an HMAC-SHA256 of
both keyed by the token. It never contains the token, it expires after :data:`COOKIE_TTL`,
rotating the token ends every login, and signing out revokes its id on the server
(:class:`Revoked`), so a copy of the cookie is refused from then on. All comparisons use
:func:`hmac.compare_digest`. With no token (only allowed for the standalone
viewer bound to loopback), requests are let in when their ``Host`` is a loopback name, so a
web page elsewhere cannot reach the viewer through DNS rebinding.

Tenancy. A page shows one tenant: the viewer's home tenant (``default``, or the one the
standalone viewer was started with ``--tenant``) unless ``?tenant=T`` names another. Session ids
are looked up only inside that tenant, so a session of tenant B is "not found" from a page of
tenant A. ``?tenant=*`` lists every tenant at once. Choosing another tenant or ``*`` needs the
admin scope: the admin token on a viewer that is not pinned (the gateway's ``/admin`` and the
standalone viewer without ``--tenant``; the standalone viewer on loopback without a token
counts as admin). A viewer started with ``--tenant T`` is pinned to T for everyone: other
tenants and ``*`` are 403.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from gateway.edge.hosts import host_of, is_loopback
from sessions.errors import InvalidNameError
from sessions.names import DEFAULT_TENANT, validate_tenant

COOKIE = "gateway_admin"
COOKIE_TTL = 12 * 3600
ALL_TENANTS = "*"
MAX_REVOKED = 10_000
_CLOCK_SKEW = 60


class Refused(Exception):
    """A request the viewer will not serve: the status and a one-line reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status






class Revoked:
    """Sign-in ids signed out before their cookie expired (in this process), forgotten once
    the cookie would have expired anyway; at most :data:`MAX_REVOKED` (the oldest go).

    The :class:`~gateway.edge.signouts.SignOuts` of one worker; workers that share a Redis
    share their sign-outs there (``coordination.redis_signouts``), so a sign-out on one ends
    the sign-in on all of them."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._until: OrderedDict[str, float] = OrderedDict()

    def add(self, sign_in: str, until: float) -> None:
        """Record ``sign_in`` as ended until ``until`` (:meth:`revoke`, without waiting)."""
        self._until[sign_in] = until
        while len(self._until) > MAX_REVOKED:
            self._until.popitem(last=False)

    def __contains__(self, sign_in: object) -> bool:
        now = self._clock()
        for old, until in list(self._until.items())[:8]:  # a few at a time: cheap and enough
            if until < now:
                del self._until[old]
        found = self._until.get(str(sign_in))
        return found is not None and found >= now

    async def revoke(self, sign_in: str, until: float) -> None:
        self.add(sign_in, until)

    async def revoked(self, sign_in: str) -> bool:
        return sign_in in self

    async def aclose(self) -> None:
        """Nothing to release (a set in memory)."""


@dataclass(frozen=True, slots=True)
class Access:
    """The viewer's access rule: its token (if any) and the tenant it is pinned to (if any)."""

    token: str | None
    pinned: str | None = None

    def __post_init__(self) -> None:
        if self.token is not None and not self.token:
            raise ValueError("an empty admin token is no token")
        if self.pinned is not None:
            validate_tenant(self.pinned)

    @property
    def home(self) -> str:
        return self.pinned or DEFAULT_TENANT

    def _key(self) -> bytes:
        assert self.token is not None
        return self.token.encode("utf-8", "surrogateescape")

    def token_matches(self, given: str) -> bool:
        if self.token is None:
            return False
        return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), self._key())

    def issue_cookie(self, now: float | None = None) -> str:
        issued = str(int(time.time() if now is None else now))
        sign_in = secrets.token_urlsafe(12)
        return f"{issued}.{sign_in}.{self._mac(issued, sign_in)}"

    def cookie_valid(self, value: str, now: float | None = None) -> bool:
        return self.cookie_id(value, now) is not None

    def cookie_id(self, value: str, now: float | None = None) -> tuple[str, float] | None:
        """The sign-in id of a valid cookie and when it expires; None for any other value."""
        if self.token is None:
            return None
        issued, _, rest = value.partition(".")
        sign_in, _, mac = rest.partition(".")
        if not issued.isdigit() or len(issued) > 12 or not sign_in or len(sign_in) > 32:
            return None
        if not hmac.compare_digest(mac.encode("ascii", "replace"),
                                   self._mac(issued, sign_in).encode("ascii", "replace")):
            return None
        age = (time.time() if now is None else now) - int(issued)
        if not -_CLOCK_SKEW <= age <= COOKIE_TTL:
            return None
        return sign_in, int(issued) + COOKIE_TTL

    def _mac(self, issued: str, sign_in: str) -> str:
        return hmac.new(self._key(), f"gateway-admin-cookie:{issued}:{sign_in}".encode(
            "utf-8", "surrogateescape"), hashlib.sha256).hexdigest()

    def authenticate(self, host: str, authorization: str, cookie: str | None) -> str | None:
        """Raise :class:`Refused` unless the request may see the viewer at all. Returns the
        sign-in id when the login cookie let it in (the caller checks it was not signed out:
        :class:`~gateway.edge.signouts.SignOuts`), else ``None``."""
        if self.token is None:
            if not is_loopback(host_of(host)):
                raise Refused(403, "this viewer answers loopback host names only")
            return None
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and self.token_matches(value.strip()):
            return None
        found = self.cookie_id(cookie) if cookie is not None else None
        if found is not None:
            return found[0]
        raise Refused(401, "sign in with the admin token")

    def tenant_for(self, requested: str | None) -> str:
        """The tenant (or :data:`ALL_TENANTS`) a request asking for ``requested`` may see."""
        if requested is None or requested == "":
            return self.home
        if requested == ALL_TENANTS:
            if self.pinned is not None:
                raise Refused(403, f"this viewer is pinned to tenant {self.pinned!r}")
            return ALL_TENANTS
        try:
            tenant = validate_tenant(requested)
        except InvalidNameError as exc:
            raise Refused(400, str(exc)) from exc
        if self.pinned is not None and tenant != self.pinned:
            raise Refused(403, f"this viewer is pinned to tenant {self.pinned!r}")
        return tenant
