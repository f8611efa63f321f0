"""The stdio transport the gateway runs MCP servers with: the SDK's, with the gateway's limits.

Like the SDK's ``stdio_client`` (newline-delimited JSON-RPC over the server's stdin and
stdout; at the end stdin is closed, the server gets :data:`EXIT_GRACE` seconds, then its whole
process group SIGTERM and, :data:`EXIT_GRACE` later, SIGKILL), with three differences:

* **where it runs** is the caller's choice (:class:`Launch`): the connection gives every
  server a private working directory and ``HOME`` (:mod:`toolsets.mcp.connection`);
* **stderr** goes to a descriptor the caller gives (:func:`toolsets.mcp.logs.stderr_pipe`: a
  capped, rotated log), never to a file the server could fill;
* **stdout is read only up to a limit per message** (``max_message_bytes``): the SDK buffered
  a whole line before parsing it, so one 100-million-character result held 50 MB and more
  before the result cap cut it to 100,000 characters. Past the limit the rest of the line is
  read and dropped as it comes, and the request it answered (its ``id``, found in the
  message's first or last 4 KiB) gets a JSON-RPC error instead, which the call turns into a
  tool error the model reads. A message whose id cannot be found is dropped; its call times
  out.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Final

import anyio
import mcp_types as types
from anyio.abc import Process
from mcp.client._transport import TransportStreams
from mcp.shared.message import SessionMessage

EXIT_GRACE: Final = 2.0
TOO_LONG: Final = -32090
"""The JSON-RPC error code of an answer that was over the size limit (not read); in the
implementation-defined range, clear of the codes the SDK gives a meaning (-32000, -32001...)."""
_EDGE: Final = 4096
_ID: Final = re.compile(rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.){0,200}")')


@dataclass(frozen=True, slots=True)
class Launch:
    """How one server process is started."""

    command: str
    args: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    stderr: int
    max_message_bytes: int


@contextlib.asynccontextmanager
async def stdio_transport(launch: Launch) -> AsyncIterator[TransportStreams]:
    """Start the server; yield the SDK's read and write streams; stop it (module docstring)."""
    process = await anyio.open_process(
        [launch.command, *launch.args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=launch.stderr, cwd=launch.cwd, env=dict(launch.env), start_new_session=True)
    send_read, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, take_write = anyio.create_memory_object_stream[SessionMessage](0)

    async def reader() -> None:
        assert process.stdout is not None
        lines = _Lines(launch.max_message_bytes)
        async with send_read:
            with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError,
                                     anyio.BrokenResourceError, OSError):
                async for chunk in process.stdout:
                    for message in lines.feed(chunk):
                        await send_read.send(message)

    async def writer() -> None:
        assert process.stdin is not None
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError,
                                 OSError):
            async with take_write:
                async for message in take_write:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(data.encode() + b"\n")
        await send_read.aclose()  # the server is gone or stopping: the session sees the end

    async with anyio.create_task_group() as group:
        group.start_soon(reader)
        group.start_soon(writer)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                write_stream.close()
                read_stream.close()
                await _stop(process)
            group.cancel_scope.cancel()


class _Lines:
    """Splits stdout into messages, never holding more than ``limit`` bytes of one."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buffer = bytearray()
        self.head = b""  # while skipping an oversize message: its first bytes, and its last
        self.tail = b""
        self.skipping = False

    def feed(self, chunk: bytes) -> list[SessionMessage | Exception]:
        out: list[SessionMessage | Exception] = []
        start = 0
        while start <= len(chunk):
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if self.skipping:
                self.tail = (self.tail + piece)[-_EDGE:]
            else:
                self.buffer += piece
                if len(self.buffer) > self.limit:
                    self.skipping = True
                    self.head, self.tail = bytes(self.buffer[:_EDGE]), bytes(self.buffer[-_EDGE:])
                    self.buffer = bytearray()
            if end < 0:
                break
            message = self._finish()
            if message is not None:
                out.append(message)
            start = end + 1
        return out

    def _finish(self) -> SessionMessage | Exception | None:
        if self.skipping:
            self.skipping = False
            found = _ID.search(self.head) or _last_id(self.tail)
            self.head = self.tail = b""
            if found is None:
                return None
            raw = found.group(1)
            request: int | str = int(raw) if raw[:1] != b'"' else raw[1:-1].decode(
                "utf-8", "replace")
            return SessionMessage(types.JSONRPCError(
                jsonrpc="2.0", id=request, error=types.ErrorData(
                    code=TOO_LONG, message=f"its answer was over {self.limit:,} bytes "
                                           "(not read)")))
        line, self.buffer = bytes(self.buffer), bytearray()
        if not line.strip():
            return None
        try:
            return SessionMessage(types.jsonrpc_message_adapter.validate_json(
                line, by_name=False))
        except ValueError as exc:
            return exc


def _last_id(tail: bytes) -> re.Match[bytes] | None:
    matches = list(_ID.finditer(tail))
    return matches[-1] if matches else None


async def _stop(process: Process) -> None:
    """Close stdin, wait, then SIGTERM and SIGKILL the process group (module docstring)."""
    assert process.stdin is not None
    assert process.stdout is not None
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if sig is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, sig)
        # (the wait also sees stdout closed, which the group's end brings with it)
        with anyio.move_on_after(EXIT_GRACE):
            await process.wait()
        if process.returncode is not None:
            break
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdout.aclose()
    # Reaped (it is dead by now); bounded: a descendant that kept a pipe open cannot hold us.
    with anyio.move_on_after(EXIT_GRACE), contextlib.suppress(OSError):
        await process.aclose()
