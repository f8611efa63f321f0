"""Who the client is behind a reverse proxy: only a trusted proxy's forwarded address counts."""

from __future__ import annotations

import pytest

from gateway.edge.hosts import TrustedProxies, same_origin

PROXIES = TrustedProxies.parse("10.0.0.0/8, 127.0.0.1")


@pytest.mark.parametrize(("peer", "forwarded", "client"), [
    ("203.0.113.5", ["198.51.100.1"], "203.0.113.5"),  # not a proxy: its header is ignored
    ("127.0.0.1", ["198.51.100.1"], "198.51.100.1"),
    ("127.0.0.1", ["6.6.6.6, 198.51.100.1"], "198.51.100.1"),  # the client may prepend lies
    ("127.0.0.1", ["198.51.100.1, 10.1.2.3"], "198.51.100.1"),  # a chain of trusted proxies
    ("127.0.0.1", ["198.51.100.1", "10.1.2.3"], "198.51.100.1"),  # several header lines
    ("127.0.0.1", [], "127.0.0.1"),
    ("127.0.0.1", ["not-an-address"], "127.0.0.1"),
    ("127.0.0.1", ["10.9.9.9"], "127.0.0.1"),  # nothing but proxies: the peer itself
])
def test_the_client_is_the_rightmost_untrusted_forwarded_address(
        peer: str, forwarded: list[str], client: str) -> None:
    """X-Forwarded-For is read only from a trusted peer, right to left, past trusted hops."""
    assert PROXIES.client(peer, forwarded) == client


def test_the_forwarded_scheme_counts_only_from_a_trusted_proxy() -> None:
    """X-Forwarded-Proto from a trusted proxy is the scheme; from anyone else it is ignored."""
    assert PROXIES.scheme("127.0.0.1", "http", "https") == "https"
    assert PROXIES.scheme("203.0.113.5", "http", "https") == "http"


def test_bad_proxy_settings_name_the_item() -> None:
    """A value that is no address or network is refused, naming it."""
    with pytest.raises(ValueError, match=r"'proxy\.example'"):
        TrustedProxies.parse("10.0.0.1, proxy.example")


def test_same_origin_compares_scheme_and_host() -> None:
    """An origin is the scheme and the host with its port."""
    assert same_origin("http://127.0.0.1:8787", "http", "127.0.0.1:8787")
    assert not same_origin("https://127.0.0.1:8787", "http", "127.0.0.1:8787")
    assert not same_origin("http://127.0.0.1:8788", "http", "127.0.0.1:8787")
