"""The MCP servers file (``GATEWAY_MCP_CONFIG``), in the ``mcpServers`` shape other clients use.

::

    {"mcpServers": {
      "clock": {"command": "${GATEWAY_PYTHON}", "args": ["-m", "toolsets.mcp.clock_server"]},
      "docs":  {"url": "https://docs.example/mcp",
                "headers": {"Authorization": "Bearer ${DOCS_TOKEN}"},
                "tenants": ["T0123"], "denyTools": ["delete_*"], "timeout": 20}
    }}

A server is stdio (``command``, ``args``, ``env``, ``cwd``) or streamable HTTP (``url``,
``headers``). Our own keys, all optional: ``allowTools`` / ``denyTools`` (tool names at the
server, ``*`` and ``?`` wildcards; deny wins), ``tenants`` (the tenants that see the server;
absent: every tenant), ``timeout`` (seconds per call, else ``GATEWAY_MCP_TOOL_TIMEOUT``),
``protocol`` (``auto``, or ``legacy`` to skip the 2026 discovery probe) and ``disabled``.
Other keys written for other clients (``type``, ``autoApprove``...) are ignored.

``${VAR}`` in a command, argument, env or header value, cwd or url is taken from the gateway's
environment, so secrets need not sit in the file; ``${GATEWAY_PYTHON}`` is the interpreter
running the gateway. Errors name the server and the key, never a value (values may be secrets).
"""

from __future__ import annotations

import fnmatch
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import orjson

from gateway.edge.errors import ConfigError

Protocol = Literal["auto", "legacy"]
PYTHON_VARIABLE = "GATEWAY_PYTHON"
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_OUR_KEYS = frozenset({"command", "args", "env", "cwd", "url", "headers", "allowTools",
                       "denyTools", "tenants", "timeout", "protocol", "disabled", "type"})


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """One configured server. Exactly one of ``command`` (stdio) and ``url`` (HTTP) is set."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    tenants: frozenset[str] | None = None
    timeout: float | None = None
    protocol: Protocol = "auto"

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"

    def allows(self, tool: str) -> bool:
        """Whether tool ``tool`` (its name at the server) is offered: allowed and not denied."""
        if any(fnmatch.fnmatchcase(tool, pattern) for pattern in self.deny):
            return False
        return not self.allow or any(fnmatch.fnmatchcase(tool, p) for p in self.allow)

    def visible_to(self, tenant: str) -> bool:
        return self.tenants is None or tenant in self.tenants

    def where(self) -> str:
        """Where the server runs, for status lines: the command or the URL without its query."""
        if self.command is not None:
            return " ".join((Path(self.command).name, *self.args))
        assert self.url is not None
        return self.url.split("?", 1)[0]


@dataclass(frozen=True, slots=True)
class McpConfig:
    path: Path | None
    servers: tuple[ServerConfig, ...]
    ignored: tuple[str, ...] = ()
    """``server.key`` of keys written for other clients that this gateway ignores."""

    def secrets(self) -> list[str]:
        """Header and env values and URL passwords: what log redaction must hide."""
        values: list[str] = []
        for server in self.servers:
            values.extend(server.headers.values())
            values.extend(server.env.values())
            if server.url is not None:
                password = urlsplit(server.url).password
                if password:
                    values.append(password)
        return [v for v in values if v]


def load_config(path: Path, environ: Mapping[str, str] | None = None) -> McpConfig:
    """Read and check the file; :class:`ConfigError` (one line, naming server and key) if bad."""
    try:
        raw = orjson.loads(path.read_bytes())
    except FileNotFoundError as exc:
        raise ConfigError(f"GATEWAY_MCP_CONFIG: no such file {path}") from exc
    except OSError as exc:
        raise ConfigError(f"GATEWAY_MCP_CONFIG: cannot read {path} ({exc.strerror})") from exc
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"GATEWAY_MCP_CONFIG: {path} is not valid JSON ({exc})") from exc
    return parse_config(raw, path, environ)


def parse_config(raw: Any, path: Path | None = None,
                 environ: Mapping[str, str] | None = None) -> McpConfig:
    env = dict(os.environ if environ is None else environ)
    env.setdefault(PYTHON_VARIABLE, sys.executable)
    servers = raw.get("mcpServers") if isinstance(raw, dict) else None
    if not isinstance(servers, dict):
        raise ConfigError('GATEWAY_MCP_CONFIG: expected {"mcpServers": {NAME: {...}}}')
    parsed: list[ServerConfig] = []
    ignored: list[str] = []
    for name, spec in servers.items():
        if not isinstance(spec, dict):
            raise ConfigError(f"MCP server {name!r}: expected an object")
        if not name or len(name) > 64:
            raise ConfigError("MCP server names must be 1 to 64 characters")
        ignored.extend(f"{name}.{key}" for key in spec if key not in _OUR_KEYS)
        if spec.get("disabled") is True:
            continue
        parsed.append(_server(name, spec, env))
    return McpConfig(path, tuple(parsed), tuple(ignored))


def _server(name: str, spec: dict[str, Any], env: Mapping[str, str]) -> ServerConfig:
    def fail(key: str, why: str) -> ConfigError:
        return ConfigError(f"MCP server {name!r}: {key} {why}")

    def text(key: str) -> str | None:
        value = spec.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise fail(key, "must be a non-empty string")
        return _expand(value, env, fail, key)

    def strings(key: str) -> tuple[str, ...]:
        value = spec.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise fail(key, "must be a list of strings")
        return tuple(value)

    def mapping(key: str) -> dict[str, str]:
        value = spec.get(key, {})
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise fail(key, "must be an object of strings")
        return {str(k): _expand(v, env, fail, f"{key}.{k}") for k, v in value.items()}

    kind = spec.get("type")
    if kind == "sse":
        raise fail("type", "sse is not supported: use the server's streamable HTTP endpoint")
    command, url = text("command"), text("url")
    if (command is None) == (url is None):
        raise ConfigError(f"MCP server {name!r}: give either command (stdio) or url (HTTP)")
    if url is not None and not url.startswith(("http://", "https://")):
        raise fail("url", "must be an http:// or https:// URL")
    stdio_only = [key for key in ("args", "env", "cwd") if key in spec]
    if url is not None and stdio_only:
        raise fail(stdio_only[0], "applies to stdio servers (command) only")
    if command is not None and "headers" in spec:
        raise fail("headers", "applies to HTTP servers (url) only")
    tenants = spec.get("tenants")
    if tenants is not None and (not isinstance(tenants, list)
                                or not all(isinstance(t, str) and t for t in tenants)):
        raise fail("tenants", "must be a list of tenant ids")
    timeout = spec.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                or timeout <= 0):
        raise fail("timeout", "must be a positive number of seconds")
    protocol = spec.get("protocol", "auto")
    if protocol not in ("auto", "legacy"):
        raise fail("protocol", "must be auto or legacy")
    return ServerConfig(
        name=name, command=command,
        args=tuple(_expand(a, env, fail, "args") for a in strings("args")),
        env=mapping("env"), cwd=text("cwd"), url=url, headers=mapping("headers"),
        allow=strings("allowTools"), deny=strings("denyTools"),
        tenants=frozenset(tenants) if tenants is not None else None,
        timeout=float(timeout) if timeout is not None else None, protocol=protocol,
    )


def _expand(value: str, env: Mapping[str, str], fail: Callable[[str, str], ConfigError],
            key: str) -> str:
    def one(match: re.Match[str]) -> str:
        found = env.get(match.group(1))
        if found is None:
            raise fail(key, f"uses ${{{match.group(1)}}}, which is not set")
        return found

    return _VARIABLE.sub(one, value)
