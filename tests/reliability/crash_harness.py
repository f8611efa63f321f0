"""Helpers for the crash-kill trials: `gateway run` as a subprocess, traffic, and the checks.

The gateway runs as ``python -m gateway run`` with Telegram (long polling or a webhook), Slack
(Events API over HTTP, or Socket Mode) and web, against the fakes in this process, and is
killed with SIGKILL. What counts as *acknowledged* is what the platform saw: a Slack delivery
answered 200 (over Socket Mode: an envelope acknowledged), a Telegram update below the fake's
``confirmed_offset`` or one its webhook POST got a 2xx for, a web message answered 200
(:mod:`tests.reliability.web_client`). The checks read the data directory (and the replies the
fakes and the web client received).

Every answer the fake model gives reads ``echo: <token> ... [end <token>]``: a bot message
with the end mark is a *complete* answer (:func:`answered`); any other bot message is a *stray*
(:func:`strays`): a placeholder ("…") or a partial preview left by a kill, counted apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil

from sessions.replay import replay_bytes
from tests.fakes.providers import ApiName, FakeProviderServer, Reply, last_user_text
from tests.fakes.slack_api import FakeSlackServer
from tests.fakes.telegram_api import FakeTelegramServer
from tests.ports import PORT_TRIES, address_in_use, free_port
from tests.reliability.web_client import WEB_CONVERSATIONS, WebMessage

TOKEN = re.compile(r"tok\d{5}")
END = re.compile(r"\[end (tok\d{5})\]")
"""The last words of every complete answer (:func:`answer_text`)."""
FILLER = ("and", "here", "is", "the", "rest", "of", "a", "slow", "answer", "that", "streams",
          "on")
PACE = 0.09
"""Seconds between the words of a slow answer: its stream outlasts the platforms' preview
delay (1 s), so a preview goes out mid-stream."""
TG_USERS = (1001, 1002, 1003)
FRESH_TG_USERS = tuple(range(2001, 2061))
"""Allowed too: people who start a conversation while the disk is full or read-only."""
SLACK_DM_USERS = ("U1", "U2")
SLACK_THREAD_USER = "U3"
GENERAL = "C0FAKEGEN"
STALL = 60.0
"""Seconds a gateway process may go without progress (no CPU time spent, no log line) while
the harness waits for it to be ready or to end. The waits are bounded by progress, not by
the whole: a cold `python -m gateway` at load 10-24 on 2 cores spends well over a minute
importing, steadily (a fixed 60 s for readiness is what runs under such load ran out of); a
process that hangs stops spending CPU and fails after this."""
SOCKET_WAIT = 5.0
"""Seconds a Socket Mode delivery waits for an open socket, then for its ack."""
WEBHOOK_SECRET = "crash-trial-secret"
_PASSED_ENV = re.compile(r"GATEWAY_|TELEGRAM_|SLACK_|ANTHROPIC_|OPENAI_")


def answer_text(token: str) -> str:
    """The whole answer to ``token``'s message (a preview holds only its start)."""
    return f"echo: {token} {' '.join(FILLER)} [end {token}]"


class SlowEcho:
    """The fake provider's answers: :func:`answer_text` for the newest token in the last user
    message, after a small random delay (so kills land while a call is held); with ``slow``,
    streamed a word every :data:`PACE` seconds. Tracks which calls are being held right now;
    ``on_call(token)``, when set, hears of each call as it comes in (the trials' kill
    switch)."""

    def __init__(self, rng: random.Random, low: float = 0.05, high: float = 0.4) -> None:
        self.rng = rng
        self.low = low
        self.high = high
        self.slow = False
        self.on_call: Callable[[str], None] | None = None
        self._held_until: list[float] = []

    def __call__(self, api: ApiName, body: dict[str, Any]) -> Reply:
        tokens = TOKEN.findall(last_user_text(body))
        token = tokens[-1] if tokens else "none"
        if self.on_call is not None:
            self.on_call(token)
        delay = self.rng.uniform(self.low, self.high)
        self._held_until.append(time.monotonic() + delay)
        return Reply.hang(delay, then=Reply.text(answer_text(token),
                                                 pace=PACE if self.slow else 0.0))

    @property
    def holding(self) -> int:
        now = time.monotonic()
        self._held_until = [t for t in self._held_until if t > now]
        return len(self._held_until)


@dataclass
class SlackMessage:
    """One person's Slack message: its envelopes (two events for a mention) and, per envelope,
    the answers each delivery got (None: no answer, the gateway was down or killed)."""

    token: str
    platform_id: str
    envelopes: list[dict[str, Any]]
    statuses: list[list[int | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.statuses = [[] for _ in self.envelopes]

    @property
    def acked(self) -> bool:
        return any(200 in answers for answers in self.statuses)

    def unanswered(self) -> list[int]:
        """Envelopes Slack would still retry (none of their deliveries got a 200)."""
        return [i for i, answers in enumerate(self.statuses) if 200 not in answers]


@dataclass
class Traffic:
    """Everything sent to the gateway, across all runs."""

    tg: FakeTelegramServer
    slack: FakeSlackServer
    rng: random.Random
    telegram: dict[int, str] = field(default_factory=dict)  # update id -> token
    tg_users: set[int] = field(default_factory=set)  # people who wrote on Telegram
    web_conversations: set[str] = field(default_factory=set)  # web conversations used
    slack_messages: list[SlackMessage] = field(default_factory=list)
    web_messages: list[WebMessage] = field(default_factory=list)
    threads: list[str] = field(default_factory=list)  # thread ts of the channel threads
    phase: str = "start"
    """The trial kind running now; each message remembers the one it was first sent in."""
    origin: dict[str, str] = field(default_factory=dict)  # token -> phase
    channel_of: dict[str, str] = field(default_factory=dict)  # token -> telegram|slack|web
    slack_mode: str = "http"
    """How Slack delivers events now: ``http`` (POST /slack/events) or ``socket``."""
    telegram_mode: str = "polling"
    """How Telegram delivers updates now: ``polling`` or ``webhook``."""
    input_of: dict[str, str] = field(default_factory=dict)
    """token -> the input it was first sent through (``telegram polling``, ``slack socket``,
    ``web``, ...)."""
    web_stream: float = 0.0
    """The share of web messages sent with ``"stream": true`` (Server-Sent Events)."""
    on_web: Callable[[str, WebMessage], None] | None = None
    """Hears what web clients get (``response``, ``delta``, ``done``): the kill switch."""
    _count: int = 0

    def _token(self, channel: str) -> str:
        self._count += 1
        token = f"tok{self._count:05d}"
        self.origin[token] = self.phase
        self.channel_of[token] = channel
        self.input_of[token] = self.input_now(channel)
        return token

    def input_now(self, channel: str) -> str:
        """The input ``channel``'s messages go through now: ``telegram polling``,
        ``telegram webhook``, ``slack http``, ``slack socket`` or ``web``."""
        if channel == "telegram":
            return f"telegram {self.telegram_mode}"
        if channel == "slack":
            return f"slack {self.slack_mode}"
        return channel

    def telegram_message(self, user: int | None = None) -> str:
        token = self._token("telegram")
        user = user if user is not None else self.rng.choice(TG_USERS)
        self.tg_users.add(user)
        update = self.tg.user_message(user, f"hello {token}", user_id=user)
        self.telegram[update["update_id"]] = token
        return token

    def slack_message(self) -> SlackMessage:
        """A DM, a mention starting a channel thread, or a mention in one."""
        if self.rng.random() < 0.6:
            return self.slack_dm(self.rng.choice(SLACK_DM_USERS))
        if self.threads and self.rng.random() < 0.7:
            return self.slack_mention(self.rng.choice(self.threads))
        return self.slack_mention(None)

    def slack_dm(self, user: str) -> SlackMessage:
        token = self._token("slack")
        return self._slack(token, [self.slack.dm_event(user, f"hi {token}")])

    def slack_mention(self, thread: str | None) -> SlackMessage:
        token = self._token("slack")
        envelopes = self.slack.mention_events(SLACK_THREAD_USER, f"hey {token}",
                                              channel=GENERAL, thread_ts=thread)
        if thread is None:
            self.threads.append(envelopes[0]["event"]["ts"])
        return self._slack(token, envelopes)

    def web_message(self, conversation: str | None = None) -> WebMessage:
        token = self._token("web")
        conversation = conversation or self.rng.choice(WEB_CONVERSATIONS)
        self.web_conversations.add(conversation)
        message = WebMessage(token, conversation, client_id=f"m-{token}",
                             stream=self.rng.random() < self.web_stream, on_event=self.on_web)
        self.web_messages.append(message)
        return message

    def _slack(self, token: str, envelopes: list[dict[str, Any]]) -> SlackMessage:
        event = envelopes[0]["event"]
        platform_id = f"{self.slack.team_id}:{event['channel']}:{event['ts']}"
        message = SlackMessage(token, platform_id, envelopes)
        self.slack_messages.append(message)
        return message

    async def deliver(self, url: str, message: SlackMessage, *, retry: bool = False) -> None:
        """POST the message's envelopes at once, like Slack (twins arrive together); with
        ``retry``, only those without a 200 yet, as Slack's retries."""
        chosen = message.unanswered() if retry else list(range(len(message.envelopes)))
        answers = await asyncio.gather(*(
            self._post(url, message.envelopes[i], len(message.statuses[i]) if retry else None)
            for i in chosen))
        for i, status in zip(chosen, answers, strict=True):
            message.statuses[i].append(status)

    async def _post(self, url: str, envelope: dict[str, Any], retry_num: int | None) -> int | None:
        if self.slack_mode == "socket":
            return await self._over_socket(envelope, retry_num)
        try:
            status, _ = await self.slack.deliver_event(url, envelope, retry_num=retry_num,
                                                       timeout=5.0)
        except (aiohttp.ClientError, TimeoutError):
            return None  # killed mid-request, or not listening yet: not acknowledged
        return status

    async def _over_socket(self, envelope: dict[str, Any], retry_num: int | None) -> int | None:
        """One Socket Mode delivery: 200 once the gateway acknowledged the envelope, None if
        no socket was open or no ack came (Slack then sends it again after a reconnect)."""
        try:
            async with asyncio.timeout(SOCKET_WAIT):
                await self.slack.socket_connected.wait()
            envelope_id = await self.slack.socket_send_event(
                envelope, retry_attempt=retry_num or 0,
                retry_reason="timeout" if retry_num else "")
            await self.slack.wait_for_ack(envelope_id, timeout=SOCKET_WAIT)
        except (RuntimeError, TimeoutError, ConnectionError, aiohttp.ClientError):
            return None  # killed, or no socket: not acknowledged
        return 200

    @property
    def unacked_slack(self) -> list[SlackMessage]:
        """Messages with an envelope Slack would still retry."""
        return [m for m in self.slack_messages if m.unanswered()]

    @property
    def unacked_telegram(self) -> list[int]:
        """Updates Telegram still holds (neither confirmed by an offset nor answered 2xx by
        the webhook)."""
        pushed = self.webhook_acked()
        return [uid for uid in self.telegram
                if uid >= self.tg.confirmed_offset and uid not in pushed]

    def webhook_acked(self) -> set[int]:
        return {d.update_id for d in self.tg.webhook_deliveries
                if d.error is None and d.status is not None and 200 <= d.status < 300}

    def acknowledged(self) -> dict[tuple[str, str], str]:
        """(channel, platform id) -> token, for every message the platform saw acknowledged."""
        pushed = self.webhook_acked()
        found = {("telegram", str(uid)): token for uid, token in self.telegram.items()
                 if uid < self.tg.confirmed_offset or uid in pushed}
        found.update({("slack", m.platform_id): m.token
                      for m in self.slack_messages if m.acked})
        found.update({("web", m.client_id): m.token for m in self.web_messages if m.acked})
        return found


class Progress:
    """Whether a process is getting on: it spent CPU time or its log grew since the last
    look. :meth:`stalled` once neither happened for :data:`STALL` seconds (or it is gone)."""

    def __init__(self, pid: int, log: Path) -> None:
        self.began = self.last = time.monotonic()
        self._log = log
        self._seen: tuple[float, int] = (-1.0, -1)
        try:
            self._process: psutil.Process | None = psutil.Process(pid)
        except psutil.Error:
            self._process = None

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.began

    def _mark(self) -> tuple[float, int]:
        cpu = -1.0
        if self._process is not None:
            with contextlib.suppress(psutil.Error):
                times = self._process.cpu_times()
                cpu = times.user + times.system
        size = -1
        with contextlib.suppress(OSError):
            size = self._log.stat().st_size
        return cpu, size

    def stalled(self) -> bool:
        mark = self._mark()
        now = time.monotonic()
        if mark != self._seen:
            self._seen, self.last = mark, now
        return now - self.last > STALL


class GatewayProcess:
    """``python -m gateway run`` in a subprocess; output goes to ``log_dir``."""

    def __init__(self, env: Mapping[str, str], cwd: Path, log_dir: Path, port: int) -> None:
        self.env = dict(env)
        self.cwd = cwd
        self.log_dir = log_dir
        self.port = port
        self.proc: asyncio.subprocess.Process | None = None
        self.runs = 0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        """This run's output."""
        return self.log_dir / f"gateway-{self.runs}.log"

    async def start(self) -> None:
        """Start ``gateway run`` on :attr:`port`; when that port was taken meanwhile (by
        anyone, while this process held it not: found free, or let go by a killed run), on a
        fresh one, :data:`PORT_TRIES` times. The webhook URL follows the port; the driver
        reads :attr:`base` for every request, so it follows too."""
        for _ in range(PORT_TRIES):
            self.runs += 1
            with self.log.open("wb") as log:
                self.proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "gateway", "run", cwd=self.cwd, env=self.env,
                    stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log)
            if await self._wait_ready():
                return
            self._move_to(free_port())
        raise RuntimeError(f"gateway found no free port in {PORT_TRIES} tries; see {self.log}")

    def _move_to(self, port: int) -> None:
        old = self.base
        self.port = port
        self.env["GATEWAY_PORT"] = str(port)
        if "TELEGRAM_WEBHOOK_URL" in self.env:
            self.env["TELEGRAM_WEBHOOK_URL"] = self.env["TELEGRAM_WEBHOOK_URL"].replace(
                old, self.base)

    async def _wait_ready(self) -> bool:
        """True once this run answers /healthz on :attr:`port`; False when it exited because
        the port was taken. Only our own process listening there counts: whoever took the
        port may answer /healthz too (another gateway's tests)."""
        assert self.proc is not None
        progress = Progress(self.proc.pid, self.log)
        async with aiohttp.ClientSession() as http:
            while not progress.stalled():
                if self.proc.returncode is not None:
                    if address_in_use(self.log.read_text(errors="replace")):
                        return False
                    raise RuntimeError(f"gateway exited with {self.proc.returncode}; see "
                                       f"{self.log}")
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with http.get(self.base + "/healthz",
                                        timeout=aiohttp.ClientTimeout(total=1)) as response:
                        if response.status == 200 and self._listening():
                            return True
                await asyncio.sleep(0.05)
        raise TimeoutError(f"gateway not healthy after {progress.seconds:.0f} s, with no "
                           f"progress in the last {STALL:.0f} s; see {self.log}")

    def _listening(self) -> bool:
        assert self.proc is not None
        with contextlib.suppress(psutil.Error):
            return any(c.status == psutil.CONN_LISTEN and c.laddr.port == self.port
                       for c in psutil.Process(self.proc.pid).net_connections("tcp"))
        return False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def signal_now(self, sig: int = signal.SIGKILL) -> bool:
        """Send ``sig`` at once, from inside a fake's handler (no await: the trials' kill at
        an exact step); False when no run is alive."""
        if self.proc is None or self.proc.returncode is not None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, sig)
        return True

    async def exited(self) -> int | None:
        """Wait for this run to end (after :meth:`signal_now`) while it makes progress;
        SIGKILL once it went :data:`STALL` seconds without (then None)."""
        if self.proc is None:
            return None
        progress = Progress(self.proc.pid, self.log)
        while not progress.stalled():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    return await self.proc.wait()
        await self.kill()
        return None

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()

    async def stop(self) -> int | None:
        """SIGTERM and wait (a clean shutdown) while it makes progress; SIGKILL once it went
        :data:`STALL` seconds without (then None)."""
        if self.proc is None or self.proc.returncode is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        return await self.exited()


def slack_input(gateway: GatewayProcess, traffic: Traffic, mode: str) -> None:
    """Set the next run's Slack input: ``http`` (events POSTed to /slack/events, signed) or
    ``socket`` (Socket Mode: the app token, no signing secret)."""
    slack = traffic.slack
    traffic.slack_mode = mode
    if mode == "socket":
        gateway.env["SLACK_APP_TOKEN"] = slack.app_token
        gateway.env.pop("SLACK_SIGNING_SECRET", None)
    else:
        gateway.env["SLACK_SIGNING_SECRET"] = slack.signing_secret
        gateway.env.pop("SLACK_APP_TOKEN", None)


async def telegram_input(gateway: GatewayProcess, tg: FakeTelegramServer, mode: str) -> None:
    """Set the next run's Telegram input: ``webhook`` (the gateway registers it at start) or
    ``polling`` (the webhook deleted first, as an operator would: the gateway never deletes
    one itself). Updates Telegram still holds carry over either way."""
    if mode == "webhook":
        gateway.env.update({
            "TELEGRAM_MODE": "webhook", "TELEGRAM_WEBHOOK_SECRET": WEBHOOK_SECRET,
            "TELEGRAM_WEBHOOK_URL": gateway.base + "/telegram/webhook"})
        return
    gateway.env["TELEGRAM_MODE"] = "polling"
    gateway.env.pop("TELEGRAM_WEBHOOK_URL", None)
    async with aiohttp.ClientSession() as http, \
            http.post(f"{tg.base_url}{tg.token}/deleteWebhook") as response:
        response.raise_for_status()


def gateway_env(data_dir: Path, port: int, tg: FakeTelegramServer, slack: FakeSlackServer,
                llm: FakeProviderServer) -> dict[str, str]:
    """The subprocess environment: ours minus any gateway/platform settings, plus the fakes."""
    env = {k: v for k, v in os.environ.items() if not _PASSED_ENV.match(k)}
    env.update({
        "PTB_TIMEDELTA": "1",
        "GATEWAY_DATA_DIR": str(data_dir), "GATEWAY_HOST": "127.0.0.1",
        "GATEWAY_PORT": str(port), "GATEWAY_CHANNELS": "telegram,slack,web",
        "GATEWAY_DURABILITY": "turn", "GATEWAY_SHUTDOWN_GRACE": "2", "GATEWAY_LOG_LEVEL": "INFO",
        # OpenAI's SDK: it imports in half the time Anthropic's does, and every trial is a
        # cold start (the provider plays no part in delivery).
        "GATEWAY_PROVIDER": "openai", "OPENAI_API_KEY": "test-key",
        "OPENAI_BASE_URL": llm.openai_base_url, "GATEWAY_PROVIDER_RETRIES": "0",
        "GATEWAY_PROVIDER_TIMEOUT": "10",
        "TELEGRAM_BOT_TOKEN": tg.token, "TELEGRAM_API_BASE_URL": tg.base_url,
        "TELEGRAM_MODE": "polling", "TELEGRAM_RATE_LIMIT": "off", "TELEGRAM_POLL_TIMEOUT": "1",
        "TELEGRAM_STALL_SECONDS": "5",
        "TELEGRAM_ALLOWED_USERS": ",".join(str(u) for u in (*TG_USERS, *FRESH_TG_USERS)),
        "SLACK_BOT_TOKEN": slack.bot_token, "SLACK_SIGNING_SECRET": slack.signing_secret,
        "SLACK_API_BASE_URL": slack.api_base_url,
        "SLACK_ALLOWED_USERS": ",".join((*SLACK_DM_USERS, SLACK_THREAD_USER)),
    })
    return env


# -- checks (read the data dir only) -----------------------------------------------------------


def session_files(data_dir: Path) -> dict[Path, bytes]:
    paths = [*data_dir.glob("sessions/*.jsonl"), *data_dir.glob("tenants/*/sessions/*.jsonl")]
    return {path: path.read_bytes() for path in sorted(paths)}


def whole_lines(data: bytes) -> bytes:
    """The bytes up to and including the last newline (what survives a torn-tail repair)."""
    return data[: data.rfind(b"\n") + 1]


@dataclass
class LogCheck:
    """What the session logs say after a run."""

    files: dict[Path, bytes]
    problems: list[str]
    torn: list[Path]
    recorded: dict[tuple[str, str], str]  # (channel, platform id) -> user text
    replies: Counter[str]  # token -> assistant messages answering it


def check_logs(data_dir: Path) -> LogCheck:
    """Replay every session file; collect problems, torn tails and the recorded inbound."""
    files = session_files(data_dir)
    problems: list[str] = []
    torn: list[Path] = []
    recorded: dict[tuple[str, str], str] = {}
    replies: Counter[str] = Counter()
    for path, data in files.items():
        try:
            replay = replay_bytes(data)
        except Exception as exc:  # any raise is a finding: report it with the file
            problems.append(f"{path.name}: replay raised {type(exc).__name__}: {exc}")
            continue
        problems.extend(f"{path.name}:{p.line}: {p.message}" for p in replay.problems)
        if replay.torn_tail:
            torn.append(path)
        channel = str(replay.header.get("channel"))
        for i in range(len(replay.messages)):
            entry = replay.messages.entry(i)
            meta = entry.get("meta") or {}
            message = entry["message"]
            if message.get("role") == "user" and "platform_id" in meta:
                text = message["content"] if isinstance(message["content"], str) else ""
                recorded[(channel, str(meta["platform_id"]))] = text
            elif message.get("role") == "assistant":
                replies.update(set(TOKEN.findall(_text_of(message["content"]))))
    return LogCheck(files, problems, torn, recorded, replies)


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(b.get("text", "")) for b in content
                        if isinstance(b, dict) and b.get("type") == "text")
    return ""


def check_prefixes(before: Mapping[Path, bytes], after: Mapping[Path, bytes]) -> list[str]:
    """Every whole line written before a kill is still there after the restart, and a torn
    tail is either untouched (ignored: nothing was appended) or gone (repaired on open)."""
    found: list[str] = []
    for path, old in before.items():
        new = after.get(path)
        kept = whole_lines(old)
        if new is None:
            found.append(f"{path.name}: file disappeared")
        elif not new.startswith(kept):
            found.append(f"{path.name}: earlier entries changed")
        elif old != kept and new != old:
            # Appended to: the torn bytes must have been cut first, so every whole line after
            # the old ones is a JSON object (a new torn tail of the latest run may follow).
            complete = new[len(kept):].split(b"\n")[:-1]
            if not all(_is_object(line) for line in complete):
                found.append(f"{path.name}: torn tail not repaired before appending")
    return found


def _is_object(line: bytes) -> bool:
    try:
        return isinstance(orjson.loads(line), dict)
    except orjson.JSONDecodeError:
        return False


def missing(acknowledged: Mapping[tuple[str, str], str], logs: LogCheck,
            owed: Sequence[str] = ()) -> list[str]:
    """Acknowledged messages that are not in any session log (with their tokens), nor in
    ``owed``: the bodies the owed journal still holds (:func:`owed_bodies`), which the next
    start records and answers. A redelivery of a message a killed run had owed (Slack retries
    what got no 200) is acknowledged from the journal at once, before a worker has recorded
    it; after the last run nothing may be left owed, so the final check passes none."""
    return [f"{channel} {pid} ({token})" for (channel, pid), token in acknowledged.items()
            if token not in logs.recorded.get((channel, pid), "")
            and not any(token in body for body in owed)]


def owed_bodies(data_dir: Path) -> list[str]:
    """The items the owed journal (``state/delivery.jsonl``) still owes, read only (opening a
    ``FileJournal`` would compact the file the next start reads)."""
    owed: dict[str, str] = {}
    try:
        data = (data_dir / "state" / "delivery.jsonl").read_bytes()
    except FileNotFoundError:
        return []
    for raw in data.split(b"\n"):
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue  # a torn last line, or the empty one after the last newline
        if not isinstance(line, list) or len(line) < 2:
            continue
        if line[0] == "owe" and len(line) == 6:
            owed[str(line[1])] = str(line[5])
        elif line[0] in ("paid", "drop"):
            owed.pop(str(line[1]), None)
    return list(owed.values())


def bot_messages(tg: FakeTelegramServer, slack: FakeSlackServer,
                 token: str) -> list[str]:
    """Where and what the bot's messages answering ``token`` say (to explain a finding)."""
    found = [f"telegram {chat}/{mid}: {m.get('text', '')!r}"
             for (chat, mid), m in tg.messages.items()
             if m["from"]["id"] == tg.bot_user["id"] and token in str(m.get("text", ""))]
    found += [f"slack {channel}/{ts} (thread {m.get('thread_ts')}): {m.get('text', '')!r}"
              for (channel, ts), m in slack.messages.items()
              if m.get("bot_id") == slack.bot_id and token in str(m.get("text", ""))]
    return found


def bot_texts(tg: FakeTelegramServer, slack: FakeSlackServer) -> list[str]:
    """The text of every message of the bot's, as it stands (edits applied)."""
    texts = [str(m.get("text", "")) for m in tg.messages.values()
             if m["from"]["id"] == tg.bot_user["id"]]
    texts += [str(m.get("text", "")) for m in slack.messages.values()
              if m.get("bot_id") == slack.bot_id]
    return texts


def answered(tg: FakeTelegramServer, slack: FakeSlackServer) -> Counter[str]:
    """How many of the bot's messages (as they stand, edits applied) are a complete answer
    to each token (they end with its end mark)."""
    return Counter(token for text in bot_texts(tg, slack) for token in set(END.findall(text)))


def bot_message_keys(tg: FakeTelegramServer, slack: FakeSlackServer) -> dict[str, str]:
    """Each of the bot's messages by a key of its own (``telegram CHAT/ID``, ``slack
    CHANNEL/TS``) -> its text as it stands."""
    found = {f"telegram {chat}/{mid}": str(m.get("text", ""))
             for (chat, mid), m in tg.messages.items() if m["from"]["id"] == tg.bot_user["id"]}
    found |= {f"slack {channel}/{ts}": str(m.get("text", ""))
              for (channel, ts), m in slack.messages.items() if m.get("bot_id") == slack.bot_id}
    return found


def stray_kind(text: str) -> str | None:
    """``placeholder`` or ``partial`` for a bot message that is no complete answer, else
    None."""
    if END.search(text):
        return None
    return "placeholder" if text.strip() in ("…", "") else "partial"


def strays(tg: FakeTelegramServer, slack: FakeSlackServer) -> Counter[str]:
    """The bot's messages that are no complete answer, by kind: ``placeholder`` (still "…")
    or ``partial`` (a preview's start of an answer). Left by kills at the one step no
    platform lets the gateway close (a message sent, its id not yet noted)."""
    return Counter(kind for text in bot_texts(tg, slack)
                   if (kind := stray_kind(text)) is not None)


# -- killing between replies -------------------------------------------------------------------

QUIESCE_TIMEOUT = 10.0


def paid_items(data_dir: Path) -> set[str]:
    """Item ids the gateway's owed journal notes as answered (``paid``, or ``seen`` once
    compacted)."""
    path = data_dir / "state" / "delivery.jsonl"
    ids: set[str] = set()
    with contextlib.suppress(FileNotFoundError):
        for raw in path.read_bytes().splitlines():
            try:
                line = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue  # a line being written right now
            if isinstance(line, list) and line and line[0] == "paid":
                ids.add(str(line[1]))
            elif isinstance(line, list) and line and line[0] in ("seen", "seen#"):
                ids.add(str(line[2]))
    return ids


def items_of_tokens(data_dir: Path) -> dict[str, set[str]]:
    """token -> ids of the items whose recorded user message carries it."""
    found: dict[str, set[str]] = {}
    for data in session_files(data_dir).values():
        for raw in data.splitlines():
            if b'"item"' not in raw:
                continue
            try:
                entry = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            meta = entry.get("meta") if isinstance(entry, dict) else None
            item = meta.get("item") if isinstance(meta, dict) else None
            content = entry.get("message", {}).get("content")
            if item is None or not isinstance(content, str):
                continue
            for token in TOKEN.findall(content):
                found.setdefault(token, set()).add(str(item))
    return found


async def quiesce(data_dir: Path, tg: FakeTelegramServer, slack: FakeSlackServer) -> bool:
    """Hold the platforms' reply methods, then wait until every reply they took is noted as
    answered in the journal: a kill now cuts no reply between the platform taking it and the
    gateway knowing (the one window no gateway can close, see docs/architecture.md). False
    when that did not happen within :data:`QUIESCE_TIMEOUT` seconds."""
    tg.outbound.close()
    slack.outbound.close()
    deadline = time.monotonic() + QUIESCE_TIMEOUT
    while time.monotonic() < deadline:
        tokens = set(answered(tg, slack))
        paid = paid_items(data_dir)
        items = items_of_tokens(data_dir)
        if all(items.get(token, set()) & paid for token in tokens):
            return True
        await asyncio.sleep(0.02)
    return False


def release_held(tg: FakeTelegramServer, slack: FakeSlackServer) -> None:
    """After the kill: the held replies were never taken (their sender is gone)."""
    tg.outbound.drop()
    slack.outbound.drop()
