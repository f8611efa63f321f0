"""A provider URL becomes a recorded endpoint as its origin only: scheme, host and port."""

from __future__ import annotations

import pytest

from sessions.endpoint import origin, server


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://api.anthropic.com", "https://api.anthropic.com:443"),
        ("https://api.openai.com/v1/", "https://api.openai.com:443"),
        ("http://localhost:8080/v1", "http://localhost:8080"),
        ("HTTPS://API.Example.COM:8443/x", "https://api.example.com:8443"),
        ("https://sk-user:sk-pass@proxy.example:8443/v1?api_key=sk-q#frag",
         "https://proxy.example:8443"),
        ("http://[::1]:9000/v1", "http://[::1]:9000"),
        ("  https://padded.example/  ", "https://padded.example:443"),
    ],
)
def test_origin_keeps_scheme_host_and_port_only(url: str, expected: str) -> None:
    """Userinfo, path, query and fragment are dropped; the scheme's port is written out."""
    assert origin(url) == expected


@pytest.mark.parametrize(
    "url", [None, "", "api.openai.com", "/v1/messages", "ftp://files.example",
            "https://", "https://host:notaport/", "https://host:99999/", "unix:///tmp/sock"])
def test_origin_refuses_what_is_not_an_http_url(url: str | None) -> None:
    """Nothing half-parsed is recorded: no endpoint rather than a wrong one."""
    assert origin(url) is None


def test_server_reads_host_and_port() -> None:
    """server() gives what the export's server.address/server.port need; a malformed or absent
    endpoint gives None, and a URL with more than an origin still yields only host and port."""
    assert server("https://api.anthropic.com:443") == ("api.anthropic.com", 443)
    assert server("http://[::1]:9000") == ("::1", 9000)
    assert server("https://key@proxy.example/v1?api_key=sk") == ("proxy.example", 443)
    assert [server(v) for v in (None, 443, "", "not a url", ["https://x"])] == [None] * 5
