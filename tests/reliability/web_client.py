"""A browser's side of ``POST /api/chat`` for the crash trials: one message, its attempts.

A browser that gets no answer (the connection dropped, a 503 while the store was down or the
gateway stopping, a 504) sends the same message again with the same client message id, a
bounded number of times. *Acknowledged* is a 200; it carries the reply, so the reply is
checked right here: it must answer this message's token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import aiohttp
import orjson

WEB_CONVERSATIONS = ("w1", "w2", "w3")
MAX_ATTEMPTS = 12
"""A browser gives up in the end: a message never answered 200 counts as not acknowledged."""
REQUEST_TIMEOUT = 30.0
"""The reply comes in the response, after the queued turns ahead of it: generous."""


@dataclass
class WebMessage:
    """One message typed in the chat page, and what each attempt to send it got (None: no
    HTTP answer, the gateway was down or killed)."""

    token: str
    conversation: str
    client_id: str
    statuses: list[int | None] = field(default_factory=list)
    reply: str | None = None
    in_flight: bool = False

    @property
    def acked(self) -> bool:
        return 200 in self.statuses

    @property
    def wants_retry(self) -> bool:
        """Not answered 200 yet, not being sent, and attempts left."""
        return not self.acked and not self.in_flight and len(self.statuses) < MAX_ATTEMPTS

    async def send(self, http: aiohttp.ClientSession, base: str) -> None:
        """One attempt: the same id every time, as a page retrying after a lost answer."""
        self.in_flight = True
        body = {"conversation": self.conversation, "text": f"web {self.token}",
                "id": self.client_id}
        try:
            async with http.post(base + "/api/chat", data=orjson.dumps(body),
                                 headers={"Content-Type": "application/json"},
                                 timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)) as response:
                status = response.status
                answer = await response.read()
        except (aiohttp.ClientError, TimeoutError):
            status, answer = None, b""
        finally:
            self.in_flight = False
        self.statuses.append(status)
        if status == 200:
            parsed = orjson.loads(answer)
            self.reply = str(parsed.get("reply")) if isinstance(parsed, dict) else None

    def findings(self) -> list[str]:
        """What is wrong with the answer this message got, if it was acknowledged."""
        if not self.acked:
            return []
        if self.reply is None or self.token not in self.reply:
            return [f"web {self.client_id} ({self.token}) got 200 with reply {self.reply!r}"]
        return []
