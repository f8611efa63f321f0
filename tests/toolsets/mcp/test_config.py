"""The MCP servers file: the mcpServers shape, our keys, ${VAR}, and one-line errors that name
the server and key but never a value; tool names within the providers' rules."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.edge.errors import ConfigError
from toolsets.mcp.config import load_config, parse_config
from toolsets.mcp.names import tool_name

PROVIDER_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def test_stdio_and_http_servers_with_our_keys(tmp_path: Path) -> None:
    """Both transports parse; allow/deny/tenants/timeout/protocol are kept; other clients'
    keys are listed as ignored; disabled servers are left out; ${VAR} is expanded."""
    config = parse_config({"mcpServers": {
        "notes": {"command": "${GATEWAY_PYTHON}", "args": ["-m", "notes", "--db=${DB}"],
                  "env": {"TOKEN": "${SECRET}"}, "cwd": "/srv", "autoApprove": ["x"],
                  "allowTools": ["get_*", "search"], "denyTools": ["get_secret"]},
        "docs": {"type": "http", "url": "https://docs.example/mcp",
                 "headers": {"Authorization": "Bearer ${SECRET}"}, "tenants": ["T1"],
                 "timeout": 5, "protocol": "legacy"},
        "off": {"command": "x", "disabled": True},
    }}, environ={"DB": "n.db", "SECRET": "s3cret", "GATEWAY_PYTHON": "/py"})
    notes, docs = config.servers
    assert (notes.transport, notes.command, notes.args) == ("stdio", "/py",
                                                             ("-m", "notes", "--db=n.db"))
    assert notes.env == {"TOKEN": "s3cret"}
    assert [notes.allows(t) for t in ("get_page", "search", "get_secret", "delete")] == [
        True, True, False, False]
    assert [notes.visible_to("anyone"), docs.visible_to("T1"), docs.visible_to("T2")] == [
        True, True, False]
    assert (docs.transport, docs.headers, docs.timeout, docs.protocol) == (
        "http", {"Authorization": "Bearer s3cret"}, 5.0, "legacy")
    assert config.ignored == ("notes.autoApprove",)


@pytest.mark.parametrize(("spec", "message"), [
    ({"args": ["a"]}, "give either command (stdio) or url (HTTP)"),
    ({"command": "x", "url": "http://h"}, "give either command (stdio) or url (HTTP)"),
    ({"url": "ftp://h"}, "url must be an http:// or https:// URL"),
    ({"url": "http://h", "env": {}}, "env applies to stdio servers (command) only"),
    ({"command": "x", "headers": {}}, "headers applies to HTTP servers (url) only"),
    ({"command": "x", "args": "a b"}, "args must be a list of strings"),
    ({"command": "x", "env": {"K": 1}}, "env must be an object of strings"),
    ({"command": "x", "tenants": "T1"}, "tenants must be a list of tenant ids"),
    ({"command": "x", "timeout": 0}, "timeout must be a positive number of seconds"),
    ({"command": "x", "protocol": "2024"}, "protocol must be auto or legacy"),
    ({"url": "http://h", "type": "sse"}, "type sse is not supported"),
    ({"command": "x", "env": {"K": "${NOPE}"}}, "env.K uses ${NOPE}, which is not set"),
])
def test_bad_server_is_one_line_naming_server_and_key(spec: dict[str, object],
                                                      message: str) -> None:
    """Each mistake is a ConfigError naming the server and key (never the value)."""
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        parse_config({"mcpServers": {"srv": {**spec, "headers_secret": "hunter22"}}},
                     environ={})
    assert "'srv'" in str(caught.value)
    assert "hunter22" not in str(caught.value)


def test_unreadable_or_misshapen_file(tmp_path: Path) -> None:
    """A missing file, bad JSON or a top level without mcpServers are one-line errors."""
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(bad)
    bad.write_text('{"servers": {}}')
    with pytest.raises(ConfigError, match="mcpServers"):
        load_config(bad)


def test_tool_names_fit_provider_rules_and_stay_distinct() -> None:
    """Plain names are server__tool; others are cleaned, cut to 64 and given a hash, so they
    stay distinct and the same on every run."""
    assert tool_name("notes", "add_note") == "notes__add_note"
    odd = [tool_name("my server", "get.page"), tool_name("my_server", "get_page"),
           tool_name("s", "x" * 100), tool_name("s", "x" * 101)]
    assert all(PROVIDER_NAME.match(name) for name in odd)
    assert len(set(odd)) == len(odd)
    assert odd[0].startswith("my_server__get_page_")
    assert tool_name("my server", "get.page") == odd[0]


def test_secrets_are_header_env_and_url_password_values() -> None:
    """What log redaction hides: every header and env value, and a URL's password."""
    config = parse_config({"mcpServers": {
        "a": {"command": "x", "env": {"TOKEN": "${T}"}},
        "b": {"url": "https://u:pw123@h/mcp", "headers": {"Authorization": "Bearer abc"}},
    }}, environ={"T": "tok-1"})
    assert config.secrets() == ["tok-1", "Bearer abc", "pw123"]
