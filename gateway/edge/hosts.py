"""Host names in ``Host`` headers and bind addresses: is this loopback? And who is the client
behind a reverse proxy the operator trusts?

Shared by the web chat and the admin viewer, which both serve without a token only to the
local machine (and refuse a non-local ``Host`` header, which blocks DNS rebinding), and which
both count things per client address (wrong admin tokens, anonymous web messages): the
address is the TCP peer's unless the peer is one of ``GATEWAY_TRUSTED_PROXIES``; then it is
taken from ``X-Forwarded-For`` (the rightmost address not itself a trusted proxy), and the
scheme from ``X-Forwarded-Proto``. A header from anyone else is ignored: a client cannot
choose the address it is counted under.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


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


@dataclass(frozen=True, slots=True)
class TrustedProxies:
    """The reverse proxies whose ``X-Forwarded-*`` headers are believed (module docstring)."""

    networks: tuple[Network, ...] = ()

    @classmethod
    def parse(cls, text: str) -> TrustedProxies:
        """``GATEWAY_TRUSTED_PROXIES``: addresses or networks, comma-separated; ValueError
        naming the first that is neither."""
        networks = []
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address or network") from None
        return cls(tuple(networks))

    def trusts(self, address: str | None) -> bool:
        ip = _ip(address)
        return ip is not None and any(ip in network for network in self.networks)

    def client(self, peer: str | None, forwarded_for: Iterable[str] = ()) -> str:
        """The client's address: ``peer``, or behind a trusted proxy the rightmost
        ``X-Forwarded-For`` address (each header value may list several) not itself trusted."""
        if not self.trusts(peer):
            return peer or "unknown"
        hops = [hop.strip() for value in forwarded_for for hop in value.split(",")]
        for hop in reversed([h for h in hops if h]):
            if _ip(hop) is None:
                return peer or "unknown"  # a hop that is no address: trust none of it
            if not self.trusts(hop):
                return hop
        return peer or "unknown"

    def scheme(self, peer: str | None, scheme: str, forwarded_proto: str | None) -> str:
        """The scheme the client used: ``X-Forwarded-Proto`` from a trusted proxy, else
        ``scheme`` (the connection's)."""
        if forwarded_proto and self.trusts(peer):
            return forwarded_proto.split(",")[0].strip().lower()
        return scheme


def _ip(address: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address((address or "").strip().strip("[]"))
    except ValueError:
        return None
