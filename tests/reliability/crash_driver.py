"""Mixed traffic for the delivery trials (crash-kill and disk faults), the last clean run, and
the tally of what became of every acknowledged message.

Telegram (polling or webhook), Slack (Events over HTTP, or Socket Mode) and web
(``/api/chat``, some streamed) at once. The deliveries are tasks, so a kill never waits on
them; what the platforms would send again (Slack's retries and its resends after a Socket
Mode reconnect, a browser's retry with the same message id; Telegram keeps what it was not
confirmed) is sent again at the start of the next run.

Nothing here waits a fixed time to see that something did *not* happen: the last clean run
sends a last message in every conversation that ever had one and waits until each is
answered; conversations are served in order, so by then any second answer to an earlier
message would have gone out, and a clean stop then ends the sending.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from tests.fakes.slack_api import FakeSlackServer
from tests.fakes.telegram_api import FakeTelegramServer
from tests.reliability.crash_harness import (
    FRESH_TG_USERS,
    SLACK_DM_USERS,
    TG_USERS,
    GatewayProcess,
    LogCheck,
    Traffic,
    answered,
    bot_messages,
)
from tests.reliability.web_client import WEB_CONVERSATIONS

SETTLE_TIMEOUT = 30.0


class Driver:
    """Sends traffic while the gateway runs."""

    def __init__(self, traffic: Traffic, gateway: GatewayProcess, rng: random.Random,
                 http: aiohttp.ClientSession) -> None:
        self.traffic = traffic
        self.gateway = gateway
        self.rng = rng
        self.http = http
        self.sent = 0
        self._fresh = 0
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def data_dir(self) -> Path:
        return Path(self.gateway.env["GATEWAY_DATA_DIR"])

    @property
    def url(self) -> str:
        return self.gateway.base + "/slack/events"

    def one(self, channel: str | None = None) -> str:
        """One new message: on ``channel``, or Telegram, Slack or web, about a third each;
        its token."""
        self.sent += 1
        draw = self.rng.random()
        if channel == "telegram" or (channel is None and draw < 0.35):
            return self.traffic.telegram_message()
        if channel == "slack" or (channel is None and draw < 0.7):
            message = self.traffic.slack_message()
            self.spawn(self.traffic.deliver(self.url, message))
            return message.token
        web = self.traffic.web_message()
        self.spawn(web.send(self.http, self.gateway.base))
        return web.token

    def one_new(self) -> None:
        """One message that starts a conversation (a new session file): a Telegram person
        writing for the first time, a new Slack thread, a new web conversation."""
        self.sent += 1
        self._fresh += 1
        draw = self._fresh % 3
        if draw == 0:
            self.traffic.telegram_message(FRESH_TG_USERS[self._fresh % len(FRESH_TG_USERS)])
        elif draw == 1:
            self.spawn(self.traffic.deliver(self.url, self.traffic.slack_mention(None)))
        else:
            message = self.traffic.web_message(f"fresh{self._fresh}")
            self.spawn(message.send(self.http, self.gateway.base))

    def retry_unacked(self) -> None:
        """What Slack does for events it got no 200 for, and a browser for a message it got
        no answer for: deliver them again."""
        for message in self.traffic.unacked_slack:
            self.spawn(self.traffic.deliver(self.url, message, retry=True))
        for web in self.traffic.web_messages:
            if web.wants_retry:
                self.spawn(web.send(self.http, self.gateway.base))

    @property
    def busy(self) -> bool:
        """Deliveries are in flight."""
        return bool(self._tasks)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run a delivery as a task (a kill never waits on it)."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def steady(self) -> None:
        while True:
            self.one()
            await asyncio.sleep(self.rng.uniform(0.02, 0.12))

    async def settled(self) -> None:
        while self._tasks:
            await asyncio.wait(list(self._tasks))


async def final_run(driver: Driver, tg: FakeTelegramServer, slack: FakeSlackServer) -> list[str]:
    """A last run with no fault: the platforms' redeliveries, then one message in every
    conversation (so every session is reopened and a torn tail repaired), all answered; then a
    clean stop. Returns what went wrong."""
    traffic = driver.traffic
    for _ in range(5):
        driver.retry_unacked()
        await driver.settled()
        if not traffic.unacked_slack and not any(m.wants_retry for m in traffic.web_messages):
            break
    tokens = [traffic.telegram_message(user) for user in sorted({*TG_USERS, *traffic.tg_users})]
    last = [traffic.slack_dm(user) for user in SLACK_DM_USERS]
    last += [traffic.slack_mention(thread) for thread in list(traffic.threads)]
    tokens += [message.token for message in last]
    web = [traffic.web_message(conversation)
           for conversation in sorted({*WEB_CONVERSATIONS, *traffic.web_conversations})]
    for message in last:
        driver.spawn(traffic.deliver(driver.url, message))
    for page in web:
        driver.spawn(page.send(driver.http, driver.gateway.base))
    findings: list[str] = []
    # Queues are served in order, so once the last messages are answered, whatever was
    # redelivered before them has been handled too. Meanwhile the platforms go on doing what
    # they do (Slack retries what got no 200, a page asks again for an answer it did not
    # get). The bound is on progress, not on the whole: a loaded machine answers slowly but
    # steadily (a fixed 30 s for everything, and a browser's 30 s, were what runs at load
    # 9-28 ran out of), and a run that stops answering fails after SETTLE_TIMEOUT seconds
    # without a new answer.
    progress, seen = time.monotonic(), -1
    while True:
        pages = [m for m in traffic.web_messages if m.reply is None and (m.acked or m in web)]
        if not (traffic.unacked_telegram or traffic.unacked_slack or pages
                or not set(tokens) <= set(answered(tg, slack))):
            break
        if not driver.busy:
            driver.retry_unacked()
        now = (len(answered(tg, slack)) + len(traffic.acknowledged())
               + sum(1 for m in traffic.web_messages if m.reply is not None))
        if now != seen:
            progress, seen = time.monotonic(), now
        elif time.monotonic() - progress > SETTLE_TIMEOUT:
            findings.append(f"final run made no progress for {SETTLE_TIMEOUT:.0f} s")
            break
        await asyncio.sleep(0.05)
    await driver.settled()
    findings += [f"final web message {m.client_id} got {m.statuses}"
                 for m in web if m.reply is None]
    # Every conversation's last message is answered, so everything owed before it was served
    # (in order): a second answer to anything would have gone out by now. The clean stop
    # ends the sending; what the platforms hold after it is final.
    code = await driver.gateway.stop()
    if code != 0:
        findings.append(f"clean stop exited with {code}")
    return findings


def repeated(traffic: Traffic, tg: FakeTelegramServer, slack: FakeSlackServer,
             logs: LogCheck) -> list[str]:
    """Messages answered more than once so far: on the platform, or in the session log."""
    found = [f"{t} answered {n} times" for t, n in answered(tg, slack).items() if n > 1]
    # Where those answers are, once each (the findings are compared as text across trials).
    found += [f"  {t}: {where}" for t, n in answered(tg, slack).items() if n > 1
              for where in bot_messages(tg, slack, t)]
    found += [f"{t} answered {n} times in the session log"
              for t, n in logs.replies.items() if n > 1]
    found += [f for m in traffic.web_messages for f in m.findings()]
    return found


@dataclass(frozen=True)
class Row:
    """What became of the acknowledged messages first sent during one kind of trial."""

    kind: str
    trials: int
    acknowledged: int
    once: int
    twice: int
    never: int
    recorded: int
    lost: int

    def cells(self) -> str:
        return (f"| {self.kind} | {self.trials} | {self.acknowledged} | {self.once} | "
                f"{self.twice} | {self.never} | {self.recorded} | {self.lost} |")


TABLE_HEAD = ("| trial kind | trials | acknowledged | answered once | answered twice | "
              "never answered | recorded | lost |\n|---|---:|---:|---:|---:|---:|---:|---:|")


def tally(traffic: Traffic, tg: FakeTelegramServer, slack: FakeSlackServer, logs: LogCheck,
          trials: Counter[str]) -> list[Row]:
    """One row per trial kind (plus the final run): each acknowledged message is answered once
    when the platform holds exactly one complete answer for it (the web client: its answer
    came in a 200) and the session log holds exactly one; recorded when its message is in the
    log. Stray placeholders and partial previews are no answers: :func:`strays` counts
    them."""
    return _rows(traffic, _complete(traffic, tg, slack), logs, trials,
                 lambda token: traffic.origin[token])


def tally_inputs(traffic: Traffic, tg: FakeTelegramServer, slack: FakeSlackServer,
                 logs: LogCheck, trials: Counter[str]) -> list[Row]:
    """As :func:`tally`, one row per input a message was first sent through (``telegram
    polling``, ``telegram webhook``, ``slack http``, ``slack socket``, ``web``); ``trials``
    counts the trials each input served."""
    return _rows(traffic, _complete(traffic, tg, slack), logs, trials,
                 lambda token: traffic.input_of[token])


def _complete(traffic: Traffic, tg: FakeTelegramServer, slack: FakeSlackServer) -> Counter[str]:
    """Complete answers per token: on Telegram and Slack, and a web message's 200."""
    platform = answered(tg, slack)
    for web in traffic.web_messages:
        if web.acked and web.reply is not None and f"[end {web.token}]" in web.reply:
            platform[web.token] += 1
    return platform


def _rows(traffic: Traffic, platform: Counter[str], logs: LogCheck, trials: Counter[str],
          row_of: Callable[[str], str]) -> list[Row]:
    rows: dict[str, Counter[str]] = {}
    for (channel, pid), token in traffic.acknowledged().items():
        row = rows.setdefault(row_of(token), Counter())
        row["acknowledged"] += 1
        counts = (platform[token], logs.replies[token])
        row["once" if counts == (1, 1) else "never" if 0 in counts else "twice"] += 1
        row["recorded" if token in logs.recorded.get((channel, pid), "") else "lost"] += 1
    kinds = [*trials, *(k for k in rows if k not in trials)]
    return [Row(kind, trials.get(kind, 0), *(rows.get(kind, Counter())[f] for f in (
        "acknowledged", "once", "twice", "never", "recorded", "lost"))) for kind in kinds]
