"""Socket Mode: events pushed over a WebSocket instead of POSTed to us.

slack_bolt's :class:`AsyncSocketModeHandler` (slack_sdk's aiohttp ``SocketModeClient``) opens
the socket with the app-level token (``apps.connections.open``), acknowledges each envelope
once our bolt app has handled it, and reconnects on ``disconnect`` requests and stale pings.

Its ``connect()`` retries until it succeeds, so :meth:`SocketMode.start` runs it as a task in
the channel's task group: a Slack outage at start-up does not hold up the gateway, and
:meth:`SocketMode.connected` tells ``/healthz`` the truth meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.app.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

log = logging.getLogger(__name__)

CLOSE_WAIT = 2.0
"""Seconds :meth:`SocketMode.aclose` waits for the client's own tasks to end."""


class SocketMode:
    """One Socket Mode connection for ``app``. Start inside the running loop."""

    def __init__(self, app: AsyncApp, app_token: str, client: AsyncWebClient) -> None:
        self._app = app
        self._app_token = app_token
        self._client = client
        self._handler: AsyncSocketModeHandler | None = None
        self._connect: asyncio.Task[None] | None = None

    async def start(self, group: asyncio.TaskGroup) -> None:
        # The handler's client creates an aiohttp session and a task when constructed, so
        # it is built here, in the running loop, not in the channel's constructor.
        self._handler = AsyncSocketModeHandler(self._app, self._app_token,
                                               web_client=self._client,
                                               logger=log.getChild("sdk"))
        self._connect = group.create_task(self._run_connect(self._handler))

    @staticmethod
    async def _run_connect(handler: AsyncSocketModeHandler) -> None:
        # connect() retries by itself; this guard only keeps a surprise from cancelling the
        # task group's owner (a failing child cancels the task that entered the group).
        try:
            # slack_bolt leaves connect_async/close_async unannotated (both return None).
            await handler.connect_async()  # type: ignore[no-untyped-call]
        except Exception:
            log.exception("slack: Socket Mode connection failed")

    @property
    def connected(self) -> bool:
        if self._handler is None:
            return False
        session = self._handler.client.current_session
        return session is not None and not session.closed and not self._handler.client.closed

    async def aclose(self) -> None:
        """Close the socket and the client's aiohttp session; idempotent."""
        handler, self._handler = self._handler, None
        if handler is None:
            return
        if self._connect is not None and not self._connect.done():
            self._connect.cancel()
        client = handler.client
        try:
            await handler.close_async()  # type: ignore[no-untyped-call]
        finally:
            # close() cancels its tasks without waiting for them; wait here so none is left
            # pending when the loop ends. asyncio.wait never swallows our own cancellation.
            tasks = [t for t in (client.message_processor, client.current_session_monitor,
                                 client.message_receiver, self._connect) if t is not None]
            if tasks:
                await asyncio.wait(tasks, timeout=CLOSE_WAIT)
            if not client.aiohttp_client_session.closed:
                with contextlib.suppress(Exception):
                    await client.aiohttp_client_session.close()
