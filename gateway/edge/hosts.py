"""Host names in ``Host`` headers and bind addresses: is this loopback?

Shared by the web chat and the admin viewer, which both serve without a token only to the
local machine (and refuse a non-local ``Host`` header, which blocks DNS rebinding).
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def is_loopback(host: str) -> bool:
    """True for ``localhost`` names and loopback IP addresses (``host`` without a port)."""
    host = host.strip().strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_of(netloc: str) -> str:
    """The host part of a ``Host`` header (``[::1]:80`` -> ``::1``, ``a:80`` -> ``a``)."""
    if netloc.startswith("["):
        return netloc[1:].split("]", 1)[0]
    return netloc.rsplit(":", 1)[0] if netloc.count(":") == 1 else netloc


def same_origin(origin: str, scheme: str, host: str) -> bool:
    """Whether an ``Origin`` header names the server a request reached: the same scheme and
    the same ``Host`` (a page served over another scheme is another origin: an ``http`` page
    on the same host must not post to an ``https`` server, nor the reverse)."""
    parts = urlsplit(origin.strip())
    return (parts.scheme.lower() == scheme.lower()
            and parts.netloc.lower() == host.strip().lower())
