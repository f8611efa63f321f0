"""Host names in ``Host`` headers and bind addresses: is this loopback?

Shared by the web chat and the admin viewer, which both serve without a token only to the
local machine (and refuse a non-local ``Host`` header, which blocks DNS rebinding).
"""

from __future__ import annotations

import ipaddress


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
