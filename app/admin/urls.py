"""URLs of the viewer's pages. Ids are validated names; query values are always encoded."""

from __future__ import annotations

from urllib.parse import quote, urlencode

from sessions.names import DEFAULT_TENANT

PREFIX = "/admin"


def _query(params: dict[str, str | int | None]) -> str:
    kept = {k: v for k, v in params.items() if v is not None and v != ""}
    return f"?{urlencode(kept)}" if kept else ""


def _tenant_param(tenant: str, home: str) -> str | None:
    return None if tenant == home else tenant


def index(**params: str | int | None) -> str:
    return f"{PREFIX}/{_query(params)}"


def session(session_id: str, tenant: str, home: str = DEFAULT_TENANT, suffix: str = "",
            **params: str | int | None) -> str:
    """``/admin/session/<id>[/suffix]``, with ``tenant=`` only when it is not the home tenant."""
    path = f"{PREFIX}/session/{quote(session_id, safe='')}{suffix}"
    return path + _query({"tenant": _tenant_param(tenant, home), **params})


def call(session_id: str, tenant: str, home: str, number: int, *, fragment: bool = False) -> str:
    return session(session_id, tenant, home, f"/call/{number}", fragment=1 if fragment else None)


def diff(session_id: str, tenant: str, home: str, a: int, b: int) -> str:
    return session(session_id, tenant, home, "/diff", a=a, b=b)


def usage(**params: str | int | None) -> str:
    return f"{PREFIX}/usage{_query(params)}"


def static(name: str) -> str:
    return f"{PREFIX}/static/{name}"
