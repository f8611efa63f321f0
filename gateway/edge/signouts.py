"""The seam for admin sign-outs every worker honours (one small Protocol).

A viewer sign-in is a signed cookie (``app/admin/auth.py``); signing out must end it on every
worker that serves ``/admin``, not only on the one that took the sign-out: behind a load
balancer the next request of a stolen copy of the cookie may reach any of them. In one process
the set lives in memory (``app.admin.auth.Revoked``); workers that share a Redis keep it there
(``coordination.redis_signouts``).
"""

from __future__ import annotations

from typing import Protocol


class SignOutsUnavailableError(Exception):
    """The shared set could not be read: the caller must not take the cookie as valid."""


class SignOuts(Protocol):
    """Sign-in ids ended before their cookie expires.

    ``revoke(sign_in, until)`` records that ``sign_in`` is over; it is forgotten after
    ``until`` (a Unix time: when the cookie expires anyway). Once ``revoke`` returned,
    ``revoked(sign_in)`` is true on every worker sharing the set, until ``until``. A ``revoke``
    that cannot reach the shared set still holds in this process and logs why. ``revoked``
    raises :class:`SignOutsUnavailableError` when it cannot tell (never a guess that lets a
    signed-out cookie in). ``aclose()`` releases the connection; idempotent.
    """

    async def revoke(self, sign_in: str, until: float) -> None: ...

    async def revoked(self, sign_in: str) -> bool: ...

    async def aclose(self) -> None: ...
