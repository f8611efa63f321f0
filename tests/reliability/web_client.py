"""A browser's side of ``POST /api/chat`` for the crash trials: one message, its attempts.

A browser that gets no answer (the connection dropped, a 503 while the store was down or the
gateway stopping, a 504, a stream cut before its ``done``) sends the same message again with
the same client message id, a bounded number of times. *Acknowledged* is a 200 (the message
is recorded); the answer comes in it (a JSON body, or the stream's ``done`` event), so the
answer is checked right here: it must answer this message's token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import orjson

WEB_CONVERSATIONS = ("w1", "w2", "w3")
MAX_ATTEMPTS = 50
"""A browser gives up in the end: a message never answered 200 counts as not acknowledged.
Generous: every trial's kill cuts the requests then open, and a page whose message was
acknowledged keeps asking for its answer as long as it is open."""
REQUEST_TIMEOUT = 90.0
"""The reply comes in the response, after the queued turns ahead of it: generous (a restart
on a loaded machine can owe a conversation dozens of turns from the trials before)."""


@dataclass
class WebMessage:
    """One message typed in the chat page, and what each attempt to send it got (None: no
    HTTP answer, the gateway was down or killed). ``stream``: sent with ``"stream": true``
    (Server-Sent Events). ``on_event(kind, message)`` hears ``response`` (a 200 came),
    ``delta`` (the first streamed text of an attempt) and ``done`` (the answer came)."""

    token: str
    conversation: str
    client_id: str
    statuses: list[int | None] = field(default_factory=list)
    reply: str | None = None
    in_flight: bool = False
    stream: bool = False
    on_event: Callable[[str, WebMessage], None] | None = None

    @property
    def acked(self) -> bool:
        return 200 in self.statuses

    @property
    def wants_retry(self) -> bool:
        """No answer yet, not being sent, and attempts left."""
        return self.reply is None and not self.in_flight and len(self.statuses) < MAX_ATTEMPTS

    def _tell(self, kind: str) -> None:
        if self.on_event is not None:
            self.on_event(kind, self)

    async def send(self, http: aiohttp.ClientSession, base: str) -> None:
        """One attempt: the same id every time, as a page retrying after a lost answer."""
        self.in_flight = True
        body = {"conversation": self.conversation, "text": f"web {self.token}",
                "id": self.client_id, "stream": self.stream}
        status: int | None = None
        reply: str | None = None
        try:
            async with http.post(base + "/api/chat", data=orjson.dumps(body),
                                 headers={"Content-Type": "application/json"},
                                 timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)) as response:
                status = response.status
                if status == 200 and response.content_type == "text/event-stream":
                    self._tell("response")  # recorded: the answer streams next
                    reply = await self._events(response)
                else:
                    answer = await response.read()
                    if status == 200:
                        parsed = orjson.loads(answer)
                        reply = str(parsed.get("reply")) if isinstance(parsed, dict) else ""
                        self._tell("response")
        except (aiohttp.ClientError, TimeoutError):
            if status != 200:
                status = None  # no HTTP answer at all
        finally:
            self.in_flight = False
        self.statuses.append(status)
        if reply is not None:
            self.reply = reply
            self._tell("done")

    async def _events(self, response: aiohttp.ClientResponse) -> str | None:
        """Read the stream to its end: the ``done`` event's reply (None: cut off, or an
        ``error`` event)."""
        kind = ""
        streamed = False
        async for raw in response.content:
            line = raw.decode("utf-8").rstrip("\r\n")
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                if kind == "delta" and not streamed:
                    streamed = True
                    self._tell("delta")
                elif kind == "done":
                    data = orjson.loads(line[6:])
                    return str(data.get("reply")) if isinstance(data, dict) else ""
                elif kind == "error":
                    return None
        return None

    def findings(self) -> list[str]:
        """What is wrong with the answer this message got, if it got one."""
        if self.reply is None:
            return []
        if f"[end {self.token}]" not in self.reply:
            return [f"web {self.client_id} ({self.token}) got 200 with reply {self.reply!r}"]
        return []
