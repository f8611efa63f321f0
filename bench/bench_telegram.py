"""Benchmark: the Telegram path end to end, against a bare python-telegram-bot echo bot.

The subject is the gateway, built by ``app.compose.build_gateway`` as ``gateway run``
builds it. It runs in long-polling mode with ``TELEGRAM_RATE_LIMIT=off``, the real ``openai``
SDK streaming from a local fake provider server (``bench/_provider.py``; it answers at once),
the JSONL store (default durability ``turn``) in a temporary directory, and INFO logging set up
as ``gateway run`` does. The floor is a raw PTB
``Bot`` polling loop that sends each message's text back with ``send_message``, one task per
update. Both use the same ``getUpdates`` parameters (``timeout``, ``allowed_updates``) and the
gateway's ``HTTPXRequest`` pool sizes.

Each subject runs in its own subprocess, so its CPU time and peak RSS are its own. The fake
Bot API (``tests/fakes/telegram_api.py``), the fake provider and the driver run in this
process, fresh fakes per run. A message's latency runs from pushing its update into the fake
to the fake recording the reply's text in that chat (the bot's ``sendMessage``, or for the
gateway the edit of the placeholder it sends first). Scenarios:

(a) 20 chats x 10 messages, closed loop: each chat sends its next message once the previous
    one is answered;
(b) 1 chat x 30 messages, the same loop in one chat.

Before each measured run, 3 messages in another chat warm the subject up.

Two floors, measured in the same rounds: the floor the targets are against is ``echo/llm``,
the same bare bot answering each message with one streamed ``chat.completions.create``
through the openai SDK against the same fake provider (the least an LLM bot does); the echo
bot itself stays in the report as context. Targets (issue 31): (a) throughput >= 0.85x the
floor's; (b) p50 latency <= 1.3x; CPU per message <= the floor's + 1.5 ms; peak RSS <= 2x.
``--diagnose`` adds the gateway with the Anthropic SDK and with the in-process
``ScriptedProvider`` (the old subject) as diagnostic rows.

Run: .venv/bin/python bench/bench_telegram.py [--rounds 7] [--poll-timeout 10] [--profile]
     [--diagnose ROUNDS]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._harness import (
    Child,
    Run,
    Scenario,
    Targets,
    alternate,
    check_provider_calls,
    closed_loop,
    cpu_check_line,
    machine_line,
    report_tables,
    serve_child,
    write_report,
)
from bench._provider import (
    LLM_FLOOR,
    PROVIDER_PROFILE_GROUPS,
    PROVIDER_VARIANTS,
    LlmReplies,
    fake_provider,
    platform_sections,
    provider_override,
    provider_settings,
)

SCENARIOS = (
    Scenario("a", "closed loop, 20 chats x 10 messages", chats=20, per_chat=10),
    Scenario("b", "one chat x 30 messages", chats=1, per_chat=30),
)
WARM_CHAT = 5000
WARM_MESSAGES = 3
SUBJECTS = ("echo", "echo/llm", "gateway")
VARIANTS = (("gateway/no-typing", "gateway without the typing action (sendChatAction a no-op)"),
            *PROVIDER_VARIANTS)
TARGETS = Targets(rate_ratio=0.85, p50_ratio=1.3, cpu_over_floor_ms=1.5, rss_ratio=2.0)
"""Diagnostics (``--diagnose``): the gateway with one part of its reply path switched off."""
PROFILE_GROUPS = (
    ("getUpdates (PTB + httpx, Update parsing included)", "telegram/_bot.py", "get_updates"),
    ("sendChatAction (the typing action)", "telegram/_bot.py", "send_chat_action"),
    ("sendMessage (the reply)", "telegram/_bot.py", "send_message"),
    ("TelegramChannel.handle: convert, dedup, record the message", "telegram/adapter.py",
     "handle"),
    ("prompt build (persona cache check)", "gateway/persona/workspace.py", "build"),
    ("render Markdown -> Telegram HTML", "telegram/render.py", "render_chunks"),
    ("session log appends (JSONL)", "sessions/jsonl.py", "append"),
    *PROVIDER_PROFILE_GROUPS,
)


def chats_of(scenario: Scenario) -> list[int]:
    base = 1001 if scenario.name == "a" else 2001
    return [base + i for i in range(scenario.chats)]


# -- subjects (children) ----------------------------------------------------------------------

def apply_variant(variant: str) -> None:
    """Diagnostics only, in the child: switch off one part of the gateway's reply path."""
    if variant == "no-typing":
        from channels.telegram.sink import TelegramTarget

        async def no_typing(self: TelegramTarget) -> None:
            return None

        TelegramTarget.typing = no_typing  # type: ignore[method-assign]
    elif variant and variant not in ("anthropic", "scripted", "fsync-off", "raw-http"):  # settings
        raise ValueError(f"unknown variant {variant!r}")


async def serve_gateway(cfg: dict[str, Any], stop: asyncio.Event, ready: Any) -> None:
    os.environ.setdefault("PTB_TIMEDELTA", "1")  # as app.compose does for the channel
    apply_variant(cfg.get("variant", ""))
    from app import logs
    from app.compose import build_gateway
    from app.config import Settings
    from app.server import freeze_heap

    settings = Settings(  # type: ignore[call-arg]  # _env_file: pydantic-settings init option
        _env_file=None,
        GATEWAY_DATA_DIR=cfg["data_dir"], GATEWAY_PORT=0, GATEWAY_CHANNELS="telegram",
        GATEWAY_SHUTDOWN_GRACE=2, TELEGRAM_BOT_TOKEN=cfg["token"],
        TELEGRAM_API_BASE_URL=cfg["base_url"], TELEGRAM_RATE_LIMIT="off",
        TELEGRAM_POLL_TIMEOUT=cfg["poll_timeout"], TELEGRAM_ALLOWED_USERS=cfg["allowed"],
        **provider_settings(cfg),
    )
    logs.configure_from(settings)
    gateway = build_gateway(settings, provider=provider_override(cfg))
    try:
        await gateway.start()
        freeze_heap()  # as `gateway run` does once started
        ready({"port": gateway.bound_port})
        await stop.wait()
    finally:
        await gateway.aclose()


async def serve_echo(cfg: dict[str, Any], stop: asyncio.Event, ready: Any) -> None:
    os.environ.setdefault("PTB_TIMEDELTA", "1")
    from telegram import Bot
    from telegram.request import HTTPXRequest

    timeout = cfg["poll_timeout"]
    llm = LlmReplies(cfg) if cfg.get("variant") == "llm" else None
    bot = Bot(cfg["token"], base_url=cfg["base_url"],
              request=HTTPXRequest(connection_pool_size=8, read_timeout=15.0, pool_timeout=30.0),
              get_updates_request=HTTPXRequest(connection_pool_size=2))
    replies: set[asyncio.Task[Any]] = set()

    async def answer(chat_id: int, text: str) -> None:
        await bot.send_message(chat_id, text if llm is None else await llm.reply(text))

    async def poll() -> None:
        offset = None
        while True:
            updates = await bot.get_updates(offset=offset, timeout=timeout,
                                            allowed_updates=["message"],
                                            read_timeout=timeout + 5)
            for update in updates:
                offset = update.update_id + 1
                message = update.message
                if message is not None and message.text:
                    task = asyncio.create_task(answer(message.chat_id, message.text))
                    replies.add(task)
                    task.add_done_callback(replies.discard)

    async with bot:
        poller = asyncio.create_task(poll())
        ready({})
        await stop.wait()
        poller.cancel()
        await asyncio.wait([poller, *replies])
        if llm is not None:
            await llm.aclose()


# -- driver -----------------------------------------------------------------------------------

def timed_fake() -> Any:
    from channels.telegram.sink import PLACEHOLDER
    from tests.fakes.telegram_api import FakeTelegramServer, JSONDict

    class TimedTelegram(FakeTelegramServer):
        """The fake, noting when each chat's reply text is recorded: a ``sendMessage`` with
        text, or the edit that puts it into the placeholder the gateway sends first (its id
        is noted in the log before any text of the answer goes out)."""

        def __init__(self) -> None:
            super().__init__()
            self.waiting: dict[int, asyncio.Future[float]] = {}

        def _noted(self, params: JSONDict) -> None:
            if params.get("text") == PLACEHOLDER:
                return
            future = self.waiting.pop(params.get("chat_id"), None)  # type: ignore[arg-type]
            if future is not None and not future.done():
                future.set_result(time.perf_counter())

        async def _send_message(self, params: JSONDict) -> JSONDict:
            result = await super()._send_message(params)
            self._noted(params)
            return result

        async def _edit_message_text(self, params: JSONDict) -> JSONDict | bool:
            result = await super()._edit_message_text(params)
            self._noted(params)
            return result

    return TimedTelegram()


async def run_one(subject: str, scenario: Scenario, round_no: int, *, poll_timeout: int,
                  profile: str | None = None) -> Run:
    chats = chats_of(scenario)
    allowed = ",".join(str(c) for c in [WARM_CHAT, *chats])
    with tempfile.TemporaryDirectory(prefix="bench-telegram-") as tmp:
        async with timed_fake() as fake, fake_provider() as provider:
            loop = asyncio.get_running_loop()

            async def send(chat: int, i: int) -> float:
                future: asyncio.Future[float] = loop.create_future()
                fake.waiting[chat] = future
                started = time.perf_counter()
                fake.user_message(chat, f"message {i} in chat {chat}")
                return await future - started

            config = {"token": fake.token, "base_url": fake.base_url, "allowed": allowed,
                      "poll_timeout": poll_timeout, "data_dir": str(Path(tmp) / "data"),
                      "profile": profile, "provider_base_url": provider.base_url}
            log = Path(tmp) / f"{subject.replace('/', '-')}.log"
            async with Child(Path(__file__), subject, config, log) as child:
                async with asyncio.timeout(30):
                    for i in range(WARM_MESSAGES):
                        await send(WARM_CHAT, i)
                if profile:
                    child.signal(signal.SIGUSR1)
                before = len(fake.sent)
                async with asyncio.timeout(120):
                    run = await closed_loop(child, subject, scenario.name, send, chats,
                                            scenario.per_chat)
            errors = [c for c in fake.sent if not c.ok]
            replies = len(fake.calls("sendMessage"))
            expected = WARM_MESSAGES + scenario.chats * scenario.per_chat
            if errors or replies != expected:
                raise RuntimeError(f"{subject}: {replies} sendMessage (expected {expected}), "
                                   f"errors {[(c.method, c.description) for c in errors]}; "
                                   f"log:\n{log.read_text()[-3000:]}")
            run.extra["calls_per_message"] = (len(fake.sent) - before) / run.messages
            check_provider_calls(subject, provider, expected)
            return run


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--poll-timeout", type=int, default=10,
                        help="getUpdates timeout (s) for both subjects")
    parser.add_argument("--profile", action="store_true",
                        help="after the rounds, one cProfile'd gateway run per scenario")
    parser.add_argument("--diagnose", type=int, default=0, metavar="ROUNDS",
                        help="after the rounds, this many rounds of the gateway against "
                             "variants with parts of its reply path switched off")
    args = parser.parse_args()
    started = time.perf_counter()
    load_before = os.getloadavg()

    async def one(subject: str, scenario: Scenario, round_no: int) -> Run:
        return await run_one(subject, scenario, round_no, poll_timeout=args.poll_timeout)

    runs = await alternate(args.rounds, SCENARIOS, SUBJECTS, one)
    tables, _ = report_tables(runs, SCENARIOS, "gateway", LLM_FLOOR, TARGETS, context="echo")
    calls = {s: sorted(r.extra["calls_per_message"] for r in runs if r.subject == s)
             for s in SUBJECTS}
    command = (f".venv/bin/python bench/bench_telegram.py --rounds {args.rounds} "
               f"--poll-timeout {args.poll_timeout}" + (" --profile" if args.profile else "")
               + (f" --diagnose {args.diagnose}" if args.diagnose else ""))
    lines = [
        "## Telegram path: gateway vs a bare PTB echo bot", "",
        f"`{command}` (ELAPSED s)", "",
        machine_line(load_before), "",
        cpu_check_line(runs), "",
        "The gateway answers through the real openai SDK, streaming from a local fake "
        "provider server in the driver process.", "",
        f"Medians of {args.rounds} rounds; ratios are medians of per-round ratios (the "
        "subjects alternate, order flipped every round). The targets are against `echo/llm`, "
        "the bare bot answering through one streamed provider call with the same SDK; the "
        "bare echo is context. Each run uses a fresh subprocess per "
        "subject and a fresh fake Bot API (in the driver process). Latency is from pushing "
        "the update into the fake to the fake recording the reply's text (its sendMessage, or "
        "the edit of the gateway's placeholder). p99 is "
        "interpolated (of 200 samples in (a), 30 in (b)).", "",
        "Bot API calls per message (all methods; sendMessage included): "
        + ", ".join(f"{s} {calls[s][len(calls[s]) // 2]:.2f}" for s in SUBJECTS) + ".", "",
        *tables,
    ]
    async def profiled(scenario: Scenario, path: str) -> Run:
        return await run_one("gateway", scenario, 0, poll_timeout=args.poll_timeout,
                             profile=path)

    lines += await platform_sections(args, "telegram", SCENARIOS, TARGETS, VARIANTS,
                                     PROFILE_GROUPS, one, profiled)
    report = ("\n".join(lines) + "\n").replace(
        "ELAPSED", f"{time.perf_counter() - started:.0f}", 1)
    print(report)
    write_report("telegram.md", report)


if __name__ == "__main__":
    if "--serve" in sys.argv:
        serve_child(serve_gateway, serve_echo)
    else:
        asyncio.run(main())
