"""One MCP server, supervised: connect, list its tools, watch it, restart it with backoff.

A supervisor task owns the SDK ``Client`` (anyio scopes must be entered and left in one task);
tool calls come from the turns' tasks and share the connection. The server is *lost* when its
event stream drops (``subscriptions/listen`` on 2026-era servers, which also carries
``tools/list_changed``), when a call finds the connection closed, or when the periodic re-list
of an older server fails; the supervisor then reconnects after 1, 2, 4... seconds (at most
:attr:`Backoff.maximum`; back to the start once it has stayed up :attr:`Backoff.reset_after`).

Tools of a server that was up stay offered while it restarts (a call answers "not available
right now"), so the tool set the model sees does not flap; a server that never came up offers
none. A failure is logged once per new reason (repeats at debug level): one clear line, never
a failed gateway.

A stdio server runs with the gateway's user rights, so where it starts is chosen for it: a
private working directory of its own (``mkdtemp``: 0700, outside the checkout and the data
folder, removed when the gateway stops), which is also its ``HOME``, unless its entry sets
``cwd`` or ``env.HOME``; its environment is the SDK's short list (``PATH``, ``USER``...) and
what its entry sets, never the gateway's secrets. Its stderr goes to a capped, rotated log
(:mod:`toolsets.mcp.logs`), and each message it answers is read only up to
:attr:`ConnectionSettings.max_message_bytes` (:mod:`toolsets.mcp.stdio`).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.stdio import get_default_environment
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CONNECTION_CLOSED,
    REQUEST_TIMEOUT,
    Implementation,
    ToolListChangedNotification,
)
from mcp_types import Tool as ListedTool
from pydantic import ValidationError

from gateway.edge.messages import ChannelContext
from gateway.edge.tasks import stop
from gateway.edge.tools import ToolResult
from toolsets.mcp.config import ServerConfig
from toolsets.mcp.logs import stderr_pipe
from toolsets.mcp.names import tool_name
from toolsets.mcp.results import to_tool_result
from toolsets.mcp.stdio import Launch, stdio_transport

log = logging.getLogger(__name__)

CLIENT_INFO = Implementation(name="gateway", version="0.1.0")
_PAGES = 100  # a server whose tools/list never ends cannot hang the supervisor
_REASON_LIMIT = 200
_CLOSE_GRACE = 10.0  # the SDK's stdio shutdown takes at most about 6 s (2 + 2 + 2)


@dataclass(frozen=True, slots=True)
class Backoff:
    initial: float = 1.0
    maximum: float = 60.0
    reset_after: float = 60.0


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    call_timeout: float = 30.0
    """Seconds a tool call may take (a server's ``timeout`` key overrides it)."""
    max_result_chars: int = 100_000
    connect_timeout: float = 15.0
    """Seconds to start (or reach) a server, handshake and list its tools."""
    poll_interval: float = 30.0
    """How often tools are re-listed (and so liveness checked) on servers without an event
    stream (pre-2026 protocol)."""
    backoff: Backoff = field(default_factory=Backoff)
    log_dir: Path | None = None
    max_message_bytes: int = 32 * 1024 * 1024
    """The most of one message read from a stdio server (its result's text and files, JSON-
    encoded); the composition root sizes it from the result and attachment caps."""


class McpTool:
    """One tool of one server, as the core's :class:`gateway.edge.tools.Tool`."""

    def __init__(self, connection: ServerConnection, listed: ListedTool) -> None:
        self._connection = connection
        self.server = connection.config.name
        self.remote_name = listed.name
        self.name = tool_name(self.server, listed.name)
        self.description = listed.description or listed.title or ""
        self.input_schema: Mapping[str, Any] = listed.input_schema

    async def run(self, args: Mapping[str, Any], context: ChannelContext) -> ToolResult:
        return await self._connection.call(self.remote_name, dict(args))


class ServerConnection:
    """A supervised server. ``status``: starting, connected, restarting, failed, stopped."""

    def __init__(self, config: ServerConfig, settings: ConnectionSettings,
                 on_change: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.settings = settings
        self.status = "starting"
        self.error: str | None = None
        self.listed: tuple[ListedTool, ...] = ()
        """Every tool the server lists (the offered ones are :attr:`tools`)."""
        self.tools: tuple[McpTool, ...] = ()
        self.protocol: str | None = None
        self.connects = 0
        self.attempts = 0
        self._on_change = on_change
        self._clock = clock
        self._client: Client | None = None
        self._wake = asyncio.Event()
        self._ready = asyncio.Event()
        self._dirty = False
        self._lost: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._scope: anyio.CancelScope | None = None
        self._streaming = False
        self._closed = False
        self._private: str | None = None

    @property
    def timeout(self) -> float:
        return self.config.timeout or self.settings.call_timeout

    def start(self) -> None:
        if self._task is None and not self._closed:
            self._task = asyncio.create_task(self._supervise(), name=f"mcp {self.config.name}")

    async def ready(self) -> None:
        """Wait until the first attempt to connect has succeeded or failed."""
        await self._ready.wait()

    async def aclose(self) -> None:
        """Stop supervising and close the connection (a stdio server's process ends)."""
        self._closed = True
        self._ready.set()
        if self._scope is not None:
            # An anyio cancellation, not task.cancel(): the SDK shields its shutdown (close
            # stdin, wait, kill, reap) from the former only.
            self._scope.cancel()
        if self._task is not None:
            await asyncio.wait([self._task], timeout=_CLOSE_GRACE)
            await stop(self._task)  # a no-op unless the graceful close hung
        self._client = None
        self.status = "stopped"
        private, self._private = self._private, None
        if private is not None:
            await asyncio.to_thread(shutil.rmtree, private, True)

    # -- calls -------------------------------------------------------------------------------

    async def call(self, tool: str, args: dict[str, Any]) -> ToolResult:
        """Call ``tool`` on the server; every failure is an error result with a short reason."""
        client = self._client
        name = self.config.name
        if client is None:
            return ToolResult(f"MCP server {name} is not available right now ({self.status})",
                              is_error=True, outcome="unavailable")
        timeout = self.timeout
        try:
            # The SDK's own read timeout cancels the request at the server; ours is a backstop.
            async with asyncio.timeout(timeout + 1.0):
                result = await client.call_tool(tool, args, read_timeout_seconds=timeout)
        except TimeoutError:
            return _timed_out(timeout)
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                return _timed_out(timeout)
            if exc.code == CONNECTION_CLOSED:
                self._lose("the connection closed")
                return ToolResult(f"MCP server {name} went away during the call",
                                  is_error=True, outcome="unavailable")
            return ToolResult(f"MCP server {name} refused the call: {_short(exc.error.message)}",
                              is_error=True)
        except ValidationError:
            return ToolResult(f"MCP server {name} sent a malformed result", is_error=True)
        except Exception as exc:  # a transport failure: httpx2/anyio/OS errors
            self._lose(_describe(exc))
            return ToolResult(f"MCP server {name} could not be reached ({type(exc).__name__})",
                              is_error=True, outcome="unavailable")
        return to_tool_result(result, self.settings.max_result_chars, tool)

    def _lose(self, reason: str) -> None:
        if self._lost is None:
            self._lost = reason
        self._wake.set()

    # -- supervision -------------------------------------------------------------------------

    async def _supervise(self) -> None:
        with anyio.CancelScope() as scope:
            self._scope = scope
            if not self._closed:
                await self._run()

    async def _run(self) -> None:
        delay = self.settings.backoff.initial
        logged: str | None = None
        while not self._closed:
            up_since: float | None = None
            self.attempts += 1
            try:
                async with AsyncExitStack() as stack:
                    async with asyncio.timeout(self.settings.connect_timeout):
                        client = await stack.enter_async_context(await self._client_for(stack))
                        await self._relist(client)
                    up_since = self._connected(client)
                    reason = await self._watch(client)
            except asyncio.CancelledError:
                raise
            except TimeoutError:
                reason = f"no answer within {self.settings.connect_timeout:g} s"
            except Exception as exc:  # whatever the SDK or the transport raised
                reason = _describe(exc)
            finally:
                self._client = None
            if self._closed:
                return
            backoff = self.settings.backoff
            if up_since is not None and self._clock() - up_since >= backoff.reset_after:
                delay = backoff.initial
            self.error = reason
            self.status = "restarting" if self.connects else "failed"
            if reason != logged:
                what = "stopped" if up_since is not None else (
                    "failed to start" if not self.connects else "failed to restart")
                log.warning("MCP server %s %s (%s); retrying in %g s", self.config.name, what,
                            reason, delay)
                logged = reason
            else:
                log.debug("MCP server %s: still down (%s)", self.config.name, reason)
            self._ready.set()
            self._on_change()
            await anyio.sleep(delay)
            delay = min(delay * 2, backoff.maximum)

    def _connected(self, client: Client) -> float:
        self._client = client
        self._lost = None
        self._wake.clear()
        self.connects += 1
        self.status = "connected"
        self.error = None
        self.protocol = client.protocol_version
        log.info("MCP server %s %s: %d tool(s) (protocol %s)", self.config.name,
                 "connected" if self.connects == 1 else "is back",
                 len(self.tools), self.protocol)
        self._ready.set()
        self._on_change()
        return self._clock()

    async def _client_for(self, stack: AsyncExitStack) -> Client:
        config = self.config
        transport: Any
        if config.command is not None:
            home = await self._home()
            env = {**get_default_environment(), "HOME": home, **config.env}
            transport = stdio_transport(Launch(
                command=config.command, args=config.args, cwd=config.cwd or home, env=env,
                stderr=stack.enter_context(stderr_pipe(self.settings.log_dir, config.name)),
                max_message_bytes=self.settings.max_message_bytes))
        else:
            assert config.url is not None
            http = await stack.enter_async_context(httpx2.AsyncClient(
                headers=dict(config.headers),
                timeout=httpx2.Timeout(self.settings.connect_timeout, read=None),
            ))
            transport = streamable_http_client(config.url, http_client=http)
        return Client(transport, mode="legacy" if config.protocol == "legacy" else "auto",
                      cache=None, client_info=CLIENT_INFO, message_handler=self._on_message)

    async def _home(self) -> str:
        """The server's private directory, made on its first start (module docstring)."""
        if self._private is None:
            safe = self.config.name.replace("/", "_")
            self._private = await asyncio.to_thread(tempfile.mkdtemp,
                                                    prefix=f"gateway-mcp-{safe}-")
        return self._private

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, ToolListChangedNotification):
            self._dirty = True
            self._wake.set()

    async def _watch(self, client: Client) -> str:
        """Serve until the connection is lost; re-list tools when the server says they
        changed (or, without an event stream, every poll interval). Returns why it ended."""
        async with anyio.create_task_group() as group:
            self._streaming = False
            group.start_soon(self._listen, client)
            try:
                reason = await self._serve(client)
            finally:
                group.cancel_scope.cancel()
        return reason

    async def _serve(self, client: Client) -> str:
        while True:
            poll = None if self._streaming else self.settings.poll_interval
            with anyio.move_on_after(poll) as waited:
                await self._wake.wait()
            if waited.cancelled_caught:
                self._dirty = True  # the periodic re-list doubles as a liveness check
            self._wake.clear()
            if self._lost is not None:
                return self._lost
            if self._dirty:
                self._dirty = False
                with anyio.fail_after(self.timeout):
                    await self._relist(client)

    async def _listen(self, client: Client) -> None:
        """Follow the 2026 event stream; returns at once on servers that have none."""
        if not (client.protocol_version or "").startswith("2026"):
            return
        try:
            async with client.listen(tools_list_changed=True) as events:
                if not events.honored.tools_list_changed:
                    return
                self._streaming = True
                self._wake.set()  # stop the poll timer the watcher may have started
                async for _event in events:
                    self._dirty = True
                    self._wake.set()
        except Exception as exc:
            self._lose(_describe(exc))
            return
        finally:
            self._streaming = False
        self._lose("the server closed its event stream")

    async def _relist(self, client: Client) -> None:
        listed: list[ListedTool] = []
        cursor: str | None = None
        for _ in range(_PAGES):
            page = await client.list_tools(cursor=cursor)
            listed.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        if tuple(listed) == self.listed:
            return
        self.listed = tuple(listed)
        self.tools = tuple(McpTool(self, tool) for tool in listed
                           if self.config.allows(tool.name))
        if self._client is not None:
            log.info("MCP server %s changed its tools: %d offered", self.config.name,
                     len(self.tools))
        self._on_change()


def _timed_out(seconds: float) -> ToolResult:
    return ToolResult(f"the tool did not answer within {seconds:g} s", is_error=True,
                      outcome="timeout")


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _REASON_LIMIT else text[: _REASON_LIMIT - 1] + "…"


def _describe(exc: BaseException) -> str:
    """One line for a failure: the innermost exception of a group, its kind and message."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return _short(exc.error.message)
    message = _short(str(exc))
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
