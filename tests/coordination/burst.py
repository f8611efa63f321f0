"""A bounded burst of web chat messages into workers that may be failing, and what the
PostgreSQL session logs say about it afterwards.

The client behaves like a platform: a message counts as *acknowledged* once a worker answered
its ``POST /api/chat`` with HTTP 200 (the stream's status line); until then it is sent again
with the same client id (after a 503, a broken connection or a timeout) for a bounded time.
Each conversation sends its next message once the previous one was answered (or its stream
ended, or it was given up), so the order a conversation's messages were sent in is the order
they must be recorded and answered in, and an outage that starts "midway" finds messages
being received and turns running. Each worker has its own fake provider (:class:`CallLog`), so
the trials can see who called the model, when, and for which message.
"""

from __future__ import annotations

import asyncio
import contextvars
import re
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
from aiohttp import web

from sessions.postgres import schema as pg_schema
from sessions.postgres.store import PostgresSessionStore
from sessions.replay import Replay, replay_bytes
from tests.coordination.cluster import Sent, WorkerProcess, sse_events
from tests.fakes.providers import ApiName, FakeProviderServer, Reply, last_user_text
from tests.web_ids import WEB_TENANT, client_label

GIVE_UP = 60.0
"""Seconds a message is resent before the client gives up on it (never reached when the
outage ends, as it does in every trial)."""
RESEND_PAUSE = 0.25
ANSWER_WAIT = 10.0
"""Seconds a conversation waits for the answer on the request before it sends its next
message anyway (as a person would; the answer is checked in the log, not here)."""
PROVIDER_DELAY = 0.1
"""How long each fake model call takes: long enough that a pause or an outage finds turns
in the middle of a call."""
FAILURE_STATUS = 502
"""The status of a stream's ``error`` event that carries the gateway's failure reply (the
apology), not an answer: a finding in every trial (the fake models never fail). A 504 says
only that the answer was not at hand on the request in time."""
FAILED_TURN = re.compile(r"gateway\.router: .*(turn failed|turn stopped|could not serve a message)")
"""A worker's log line saying a turn failed and its failure reply was sent (or would have
been: a web request that had its answer already drops a later reply, a platform does not)."""
_MESSAGE = re.compile(r"message (\d+) in (c\d+)")
_arrived: contextvars.ContextVar[float] = contextvars.ContextVar("arrived")


def plan(conversations: int, per_conversation: int) -> dict[str, list[Sent]]:
    return {f"c{c:02d}": [Sent(f"c{c:02d}", f"c{c:02d}-{i}", f"message {i} in c{c:02d}")
                          for i in range(per_conversation)]
            for c in range(conversations)}


@dataclass(frozen=True, slots=True)
class Call:
    """One model call as a worker's fake provider saw it arrive (event-loop time of the
    request's head, before its body was read)."""

    at: float
    worker: str
    conversation: str
    message: str  # the client id of the message answered


class CallLog(FakeProviderServer):
    """A worker's own fake OpenAI endpoint: answers ``echo: ...`` after
    :data:`PROVIDER_DELAY`, and records every call into the shared ``calls`` list."""

    def __init__(self, worker: str, calls: list[Call]) -> None:
        super().__init__()
        self.worker = worker
        self.calls = calls
        self.validate = False  # the request bodies are not what these trials are about
        self.default = self._answer

    async def _handle_openai(self, request: web.Request) -> web.StreamResponse:
        # The time the head arrived: a call a worker started before it was paused may have
        # its body read only after it resumed, and must still count as started before.
        _arrived.set(asyncio.get_running_loop().time())
        return await super()._handle_openai(request)

    def _answer(self, api: ApiName, body: dict[str, Any]) -> Reply:
        text = last_user_text(body)
        found = _MESSAGE.search(text)
        if found is not None:
            conv = found.group(2)
            self.calls.append(Call(_arrived.get(), self.worker, conv,
                                   f"{conv}-{found.group(1)}"))
        return Reply.hang(PROVIDER_DELAY, Reply.text(f"echo: {text}"))

    def env(self) -> dict[str, str]:
        return {"GATEWAY_PROVIDER": "openai", "OPENAI_API_KEY": "test-key",
                "OPENAI_BASE_URL": self.openai_base_url, "GATEWAY_PROVIDER_RETRIES": "0",
                "GATEWAY_PROVIDER_TIMEOUT": "30"}


class RetryingClient:
    """Sends each message to a random worker it may use until one acknowledges it."""

    def __init__(self, http: aiohttp.ClientSession, workers: list[WorkerProcess],
                 pick: Callable[[list[WorkerProcess]], WorkerProcess]) -> None:
        self.http = http
        self.workers = workers
        self.pick = pick
        self.avoid: set[str] = set()
        """Workers a load balancer would not send to now (a paused one)."""
        self.refused = 0
        """Attempts not acknowledged (503, broken connection, timeout)."""
        self.acked = 0

    async def send(self, sent: Sent) -> None:
        """Until acknowledged, then read the answer (or until :data:`GIVE_UP` passed)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + GIVE_UP
        while loop.time() < deadline:
            usable = [w for w in self.workers if w.alive and w.name not in self.avoid]
            worker = self.pick(usable)
            sent.attempts.append(worker.name)
            try:
                await self._post(worker, sent)
            except (aiohttp.ClientError, ConnectionError, TimeoutError) as exc:
                sent.error = type(exc).__name__
            if sent.acked:
                return
            self.refused += 1
            await asyncio.sleep(RESEND_PAUSE)

    async def _post(self, worker: WorkerProcess, sent: Sent) -> None:
        body = {"conversation": sent.conversation, "text": sent.text, "id": sent.client_id,
                "stream": True}
        async with self.http.post(f"{worker.base}/api/chat", json=body) as response:
            if response.status != 200:
                sent.error = f"HTTP {response.status}"
                return
            sent.acked = True  # the platform's "received": what the trials hold workers to
            self.acked += 1
            try:
                async with asyncio.timeout(ANSWER_WAIT):
                    await self._answer(response, sent)
            except TimeoutError:
                sent.error = "no answer on the request in time"  # it is in the history

    @staticmethod
    async def _answer(response: aiohttp.ClientResponse, sent: Sent) -> None:
        async for event, data in sse_events(response):
            if event == "done":
                sent.reply = str(data["reply"])
                return
            if event == "error":
                sent.error = str(data.get("error"))
                if data.get("status") == FAILURE_STATUS:
                    sent.failed = sent.error
                return


async def run_burst(client: RetryingClient, messages: dict[str, list[Sent]],
                    midway: asyncio.Event, midway_at: int,
                    disrupt: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Every conversation at once, each sending its next message once the previous one was
    answered (or its stream ended, or it was given up), as a person chatting would;
    ``midway`` is set once ``midway_at`` messages were acknowledged, and ``disrupt`` runs
    beside."""

    async def conversation(items: list[Sent]) -> None:
        for sent in items:
            await client.send(sent)
            if client.acked >= midway_at:
                midway.set()

    async with asyncio.TaskGroup() as group:
        group.create_task(disrupt())
        for items in messages.values():
            group.create_task(conversation(items))


async def drained(url: str, schema: str, within: float) -> int:
    """Wait until no inbox row is unanswered (at most ``within`` seconds); how many are."""
    conn = await asyncpg.connect(url, timeout=10)
    query = f"SELECT count(*) FROM {pg_schema.quoted(schema)}.inbox WHERE answered_at IS NULL"
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            owed = int(await conn.fetchval(query))
            if owed == 0 or loop.time() >= deadline:
                return owed
            await asyncio.sleep(0.2)
    finally:
        await conn.close()


@dataclass
class Figures:
    """What one trial found, as printed (and appended to the report) and as asserted."""

    trial: str
    sent: int = 0
    acknowledged: int = 0
    answered_once: int = 0
    answered_twice: int = 0
    """Acknowledged messages with more than one answer."""
    never_answered: int = 0
    """Acknowledged messages with no answer in the log (the lost ones included)."""
    recorded: int = 0
    """Acknowledged messages found in the session log."""
    lost: int = 0
    """Acknowledged messages not in the session log at all."""
    recorded_twice: int = 0
    """Messages (acknowledged or not) in the log more than once."""
    unacked_answered_twice: int = 0
    out_of_order: list[str] = field(default_factory=list)
    """Conversations whose log order is not the order their messages were sent in."""
    refused: int = 0
    no_reply: int = 0
    """Acknowledged messages whose request did not carry the answer (it ended early, timed
    out or said 504): the answer is in the history, not on the request."""
    apologised: int = 0
    """Acknowledged messages whose request got the gateway's failure reply instead of an
    answer (counted as answered by the log, which does not hold the apology)."""
    turns_failed: int = 0
    """Turns the workers' logs say failed (each one answered with the failure reply)."""
    notes: str = ""
    problems: list[str] = field(default_factory=list)
    recorded_calls: Counter[str] = field(default_factory=Counter)
    """Model calls the logs record, by the client id of the message each one answers."""
    """The log of each conversation with a finding, as (role, client id) steps, to read."""

    def line(self) -> str:
        return (f"{self.trial}: trials 1, sent {self.sent}, acknowledged {self.acknowledged}, "
                f"answered once {self.answered_once}, answered twice {self.answered_twice}, "
                f"never answered {self.never_answered}, recorded {self.recorded}, "
                f"lost {self.lost}; recorded twice {self.recorded_twice}, out of order "
                f"{len(self.out_of_order)}, attempts refused {self.refused}, answers not on "
                f"their request {self.no_reply}, apologies {self.apologised}, turns failed "
                f"{self.turns_failed}"
                + (f"; {self.notes}" if self.notes else ""))


async def tally(trial: str, url: str, schema: str,
                messages: dict[str, list[Sent]]) -> Figures:
    """Read every conversation's session log(s) and count, per acknowledged message, the
    times it was recorded and the answers that follow it."""
    figures = Figures(trial)
    store = await PostgresSessionStore.connect(url, schema=schema)
    try:
        sessions = await store.list_sessions(WEB_TENANT)
        by_conv: dict[str, list[str]] = {}
        for info in sorted(sessions, key=lambda i: (i.started_at or "", i.session_id)):
            by_conv.setdefault(client_label(info.conversation), []).append(info.session_id)
        for conv, items in messages.items():
            order: list[str] = []
            answers: Counter[str] = Counter()
            steps: list[str] = []
            for session_id in by_conv.get(f"web:{conv}", []):
                replay = replay_bytes(await store.read_log(WEB_TENANT, session_id))
                _read(replay, order, answers, steps)
                _count_calls(replay, figures.recorded_calls)
            before = (figures.recorded_twice, figures.answered_twice, figures.never_answered,
                      figures.lost, len(figures.out_of_order), figures.unacked_answered_twice,
                      figures.apologised)
            times = Counter(order)
            figures.recorded_twice += sum(1 for n in times.values() if n > 1)
            sent_order = [s.client_id for s in items]
            if [uid for uid in sent_order if uid in times] != list(dict.fromkeys(order)):
                figures.out_of_order.append(conv)
            for sent in items:
                figures.sent += 1
                if not sent.acked:
                    if answers[sent.client_id] > 1:
                        figures.unacked_answered_twice += 1
                    continue
                figures.acknowledged += 1
                figures.no_reply += sent.reply is None
                figures.apologised += sent.failed is not None
                figures.recorded += sent.client_id in times
                figures.lost += sent.client_id not in times
                n = answers[sent.client_id]
                figures.answered_once += n == 1
                figures.answered_twice += n > 1
                figures.never_answered += n == 0
            after = (figures.recorded_twice, figures.answered_twice, figures.never_answered,
                     figures.lost, len(figures.out_of_order), figures.unacked_answered_twice,
                     figures.apologised)
            if after != before:
                lost = [s.client_id for s in items if s.acked and s.client_id not in times]
                rows = [f"{uid}: {await _inbox_row(store, uid)}" for uid in lost]
                apologies = [f"{s.client_id}: apology" for s in items if s.failed is not None]
                figures.problems.append("; ".join([
                    f"{conv}: {' '.join(steps)}", f"sessions {by_conv.get(f'web:{conv}')}",
                    *rows, *apologies]))
    finally:
        await store.aclose()
    return figures


def failed_turns(logs: list[Path]) -> int:
    """Turns the workers' logs say failed (:data:`FAILED_TURN`)."""
    return sum(len(FAILED_TURN.findall(log.read_text(errors="replace"))) for log in logs
               if log.exists())


async def _inbox_row(store: PostgresSessionStore, client_id: str) -> str:
    """What the inbox says of a message the log lacks (to read in a failure)."""
    async with store.connection() as conn:
        rows = await conn.fetch(
            f"SELECT dedup, attempts, answered_at IS NOT NULL AS answered, session_id"
            f" FROM {store.quoted_schema}.inbox WHERE dedup LIKE $1", f"%{client_id}")
    return "; ".join(str(dict(r)) for r in rows) or "no inbox row"


def _count_calls(replay: Replay, counts: Counter[str]) -> None:
    """Count each recorded call under the message it answers (the last user message sent)."""
    for turn in replay.calls:
        users = [m for m in replay.sent(turn) if m.get("role") == "user"]
        content = users[-1].get("content") if users else None
        found = _MESSAGE.search(content) if isinstance(content, str) else None
        if found is not None:
            counts[f"{found.group(2)}-{found.group(1)}"] += 1


def _read(replay: Replay, order: list[str], answers: Counter[str], steps: list[str]) -> None:
    """Append the client ids of a log's user messages to ``order``; count the assistant
    messages that follow each one."""
    current: str | None = None
    for index in range(len(replay.messages)):
        entry = replay.messages.entry(index)
        message = entry["message"]
        if message["role"] == "user" and isinstance(message["content"], str):
            current = str(entry["meta"]["platform_id"])
            order.append(current)
            steps.append(f"u:{current}")
        elif message["role"] == "assistant" and current is not None:
            answers[current] += 1
            steps.append(f"a:{current}")
