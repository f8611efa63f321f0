"""The reply sink of one web chat request: deltas and files as events for the stream, the
turn's end as a future the request waits on."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from channels.web.convert import file_json
from gateway.edge.history import HistoryFile
from gateway.edge.messages import OutboundFile


class WebSink:
    """The reply sink of one HTTP request.

    Deltas go into :attr:`events` when the request streams; the end of the turn resolves
    :attr:`result` (``(True, text)`` for finish, ``(False, apology)`` for fail) and is also
    queued as the last event. A reply abandoned by its worker (the lease went; another worker
    answers into this same request) queues ``retract``: the page clears the streamed text,
    and the next holder's deltas start afresh. Files the agent sends are listed in
    :attr:`files` (and queued as ``file`` events, their JSON as text): the page offers them
    as download links. Calls after the end are ignored.
    """

    def __init__(self, *, stream: bool, conversation: str = "") -> None:
        self.stream = stream
        self.conversation = conversation
        self.events: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self.result: asyncio.Future[tuple[bool, str]] = asyncio.get_running_loop().create_future()
        self.files: list[dict[str, Any]] = []

    async def send_file(self, file: OutboundFile) -> None:
        if self.result.done():
            return
        shown = file_json(HistoryFile(file.name, file.media_type, len(file.data), file.hash,
                                      sent=True), self.conversation)
        self.files.append(shown)
        if self.stream:
            self.events.put_nowait(("file", orjson.dumps(shown).decode()))

    async def typing(self) -> None:
        return None

    async def delta(self, text: str) -> None:
        if self.stream and not self.result.done():
            self.events.put_nowait(("delta", text))

    async def retract(self) -> None:
        if self.stream and not self.result.done():
            self.events.put_nowait(("retract", ""))

    async def finish(self, text: str) -> None:
        self._end(True, text)

    async def fail(self, text: str) -> None:
        self._end(False, text)

    def _end(self, ok: bool, text: str) -> None:
        if not self.result.done():
            self.result.set_result((ok, text))
            self.events.put_nowait(("done" if ok else "error", text))
