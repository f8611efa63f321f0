"""Loopback ports for the servers the tests start, and for the dead ends they knock on.

A port found free (bound to port 0, then closed) can be taken by another process before our
server binds it: the machine runs other test servers (PostgreSQL, Redis, RabbitMQ, our own
private ones), and every outgoing connection takes a port from the same range. So a server
that can bind port 0 itself does (aiohttp, the gateway with ``GATEWAY_PORT=0`` and
``bound_port``); one that needs its number up front (``redis-server --port``, ``pg_ctl``, a
gateway whose webhook URL names its port) starts with a retry on "address already in use",
:data:`PORT_TRIES` times; and a port that must refuse connections stays bound, not listening,
for as long as the test knocks on it (:func:`refusing_port`).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

PORT_TRIES = 5
"""Starts of a server on a fresh port before a taken port counts as a failure."""


def free_port() -> int:
    """A loopback port nobody had bound a moment ago. It may be taken before a server binds
    it: start that server with a retry (see the module docstring)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def address_in_use(text: str) -> bool:
    """Whether a server's error or log says its port was taken (asyncio, aiohttp and the
    gateway say "address already in use", redis-server and PostgreSQL "Address ...")."""
    return "address already in use" in text.lower()


@contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback port where connections are refused while the block runs: bound but not
    listening, so no other process can listen there meanwhile (a closed probe's port could
    be served by whoever took it, and a test expecting a refusal would get an answer)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])
