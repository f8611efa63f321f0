"""Who may see the viewer, and which tenants they see.

Authentication. With a token configured, a request is let in by ``Authorization: Bearer
<token>`` or by the login cookie; anything else gets 401 (the login form). The cookie holds
``<issued>.<mac>``, an HMAC-SHA256 of the issue time keyed by the token: it never contains the
token, it expires after :data:`COOKIE_TTL`, and rotating the token ends every login. All
comparisons use :func:`hmac.compare_digest`. With no token (only allowed for the standalone
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
import time
from dataclasses import dataclass

from gateway.edge.hosts import host_of, is_loopback
from sessions.errors import InvalidNameError
from sessions.names import DEFAULT_TENANT, validate_tenant

COOKIE = "gateway_admin"
COOKIE_TTL = 12 * 3600
ALL_TENANTS = "*"
_CLOCK_SKEW = 60


class Refused(Exception):
    """A request the viewer will not serve: the status and a one-line reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status






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
        return f"{issued}.{self._mac(issued)}"

    def cookie_valid(self, value: str, now: float | None = None) -> bool:
        if self.token is None:
            return False
        issued, _, mac = value.partition(".")
        if not issued.isdigit() or len(issued) > 12:
            return False
        if not hmac.compare_digest(mac.encode("ascii", "replace"),
                                   self._mac(issued).encode("ascii")):
            return False
        age = (time.time() if now is None else now) - int(issued)
        return -_CLOCK_SKEW <= age <= COOKIE_TTL

    def _mac(self, issued: str) -> str:
        return hmac.new(self._key(), b"gateway-admin-cookie:" + issued.encode(),
                        hashlib.sha256).hexdigest()

    def authenticate(self, host: str, authorization: str, cookie: str | None) -> None:
        """Raise :class:`Refused` unless the request may see the viewer at all."""
        if self.token is None:
            if not is_loopback(host_of(host)):
                raise Refused(403, "this viewer answers loopback host names only")
            return
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and self.token_matches(value.strip()):
            return
        if cookie is not None and self.cookie_valid(cookie):
            return
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
