"""The running gateway's control socket: how ``gateway forget`` hands an erasure to it.

``gateway run`` listens on a Unix socket in its data directory, ``<data>/state/control.sock``
(the folder is 0700, the socket 0600; a data directory whose path is too long for a socket
name gets an abstract socket named after it instead), and answers only its own user (and
root), checked on every connection (``SO_PEERCRED``). A request is one JSON line, and so is
its answer::

    {"op": "forget", "user": "telegram:1001", "tenant": "default", "dry_run": false}
    {"ok": true, "removed": [["memory", "memory/..."], ["session", "2026..."], ...]}
    {"ok": false, "error": "2 conversation(s) on telegram were still busy after 30 s"}

The erasure itself is :class:`gateway.erasure.service.ErasureService`'s. :func:`ask` is the
command's side: ``None`` when no gateway listens there.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

from sessions.files import ensure_private_dir

log = logging.getLogger(__name__)

SOCKET_NAME = "control.sock"
MAX_REQUEST = 64 * 1024
MAX_PATH = 107  # sockaddr_un.sun_path, less its terminating NUL

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


def address(data_dir: Path) -> str:
    """Where the gateway of ``data_dir`` listens (a path, or an abstract name: ``\\0...``)."""
    path = data_dir.resolve() / "state" / SOCKET_NAME
    if len(os.fsencode(path)) <= MAX_PATH:
        return str(path)
    digest = hashlib.sha256(os.fsencode(path)).hexdigest()[:32]
    return f"\0gateway-control-{digest}"


class ControlServer:
    """The socket, served while the gateway runs (an async context manager)."""

    def __init__(self, data_dir: Path, handle: Handler) -> None:
        self.address = address(data_dir)
        self.data_dir = data_dir
        self.handle = handle
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> ControlServer:
        if not self.address.startswith("\0"):
            path = Path(self.address)
            ensure_private_dir(self.data_dir)
            ensure_private_dir(path.parent)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # a socket a killed run left behind
        self._server = await asyncio.start_unix_server(self._serve, self.address,
                                                       limit=MAX_REQUEST)
        if not self.address.startswith("\0"):
            os.chmod(self.address, 0o600)
        return self

    async def __aexit__(self, *exc: object) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        await server.wait_closed()
        if not self.address.startswith("\0"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.address)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if not _trusted(writer):
                writer.write(orjson.dumps({"ok": False, "error": "not this gateway's user"})
                             + b"\n")
                return
            try:
                request = orjson.loads(await reader.readline())
            except (ValueError, asyncio.LimitOverrunError, orjson.JSONDecodeError):
                request = None
            if not isinstance(request, dict):
                answer: dict[str, Any] = {"ok": False, "error": "not a JSON object"}
            else:
                answer = await self.handle(request)
            writer.write(orjson.dumps(answer) + b"\n")
            await writer.drain()
        except (ConnectionError, OSError):
            pass  # the command went away; the erasure (if any) is done or refused anyway
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()


def _trusted(writer: asyncio.StreamWriter) -> bool:
    sock = writer.get_extra_info("socket")
    if sock is None:
        return False
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid in (os.getuid(), 0)


async def served(data_dir: Path) -> bool:
    """Whether a gateway is running on ``data_dir`` now (its control socket answers)."""
    try:
        _, writer = await asyncio.open_unix_connection(address(data_dir))
    except (FileNotFoundError, ConnectionRefusedError):
        return False
    writer.close()
    with contextlib.suppress(ConnectionError, OSError):
        await writer.wait_closed()
    return True


async def ask(data_dir: Path, request: dict[str, Any], timeout: float) -> dict[str, Any] | None:  # noqa: ASYNC109
    """Send ``request`` to the gateway of ``data_dir`` and return its answer; ``None`` when
    nobody listens there. Raises ``TimeoutError`` when the answer takes over ``timeout``."""
    try:
        reader, writer = await asyncio.open_unix_connection(address(data_dir),
                                                             limit=16 * 1024 * 1024)
    except (FileNotFoundError, ConnectionRefusedError):
        return None
    try:
        writer.write(orjson.dumps(request) + b"\n")
        await writer.drain()
        async with asyncio.timeout(timeout):
            line = await reader.readline()
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()
    if not line:
        raise ConnectionError("the gateway closed the control socket without an answer")
    answer = orjson.loads(line)
    if not isinstance(answer, dict):
        raise ConnectionError("the gateway's answer is not a JSON object")
    return answer
