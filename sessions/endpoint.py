"""The provider endpoint a call went to, as a call entry records it: an origin, nothing more.

A call entry's optional ``endpoint`` is ``scheme://host:port`` (the port always written, the
scheme's default when the URL names none; an IPv6 host in brackets). It is metadata beside the
request, never part of the body, so replay rebuilds the same bytes with or without it. It is
what ``server.address`` / ``server.port`` of an exported span come from.

:func:`origin` is the one way a URL becomes an endpoint: userinfo (a key some proxies take as
``https://key@host``), path, query and fragment never reach the log.
"""

from __future__ import annotations

from functools import lru_cache
from urllib.parse import urlsplit

_DEFAULT_PORTS = {"https": 443, "http": 80}


@lru_cache(maxsize=64)  # called per recorded call with the provider's one or two URLs
def origin(url: str | None) -> str | None:
    """``scheme://host:port`` of ``url``; None when it is not an absolute http(s) URL with a
    host (then nothing is recorded rather than something half-parsed)."""
    if not url:
        return None
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:  # a port that is not a number, or out of range; a malformed IPv6 host
        return None
    scheme = parts.scheme.lower()
    host = parts.hostname  # lower-cased, without userinfo, port or brackets
    if scheme not in _DEFAULT_PORTS or not host:
        return None
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port if port is not None else _DEFAULT_PORTS[scheme]}"


def server(endpoint: object) -> tuple[str, int] | None:
    """``(host, port)`` of a recorded endpoint (host without brackets); None when the entry
    has none or it is not an http(s) URL. Read through :func:`origin` again, so nothing but
    host and port comes out of whatever a log holds."""
    clean = origin(endpoint) if isinstance(endpoint, str) else None
    if clean is None:
        return None
    parts = urlsplit(clean)
    if parts.hostname is None or parts.port is None:  # origin() writes both; never here
        return None
    return parts.hostname, parts.port
