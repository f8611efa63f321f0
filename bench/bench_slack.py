"""Benchmark: the Slack path end to end (Events API over HTTP), against a bare aiohttp echo.

The subject is the gateway, built by ``app.compose.build_gateway`` as ``gateway run``
builds it: Slack over HTTP (``POST /slack/events``; bolt, slack_sdk), the real ``openai`` SDK
streaming from a local fake provider server (``bench/_provider.py``; it answers at once), the
JSONL store (default durability ``turn``) in a temporary directory, and INFO logging set up as
``gateway run`` does. The floor is a bare
aiohttp handler. It verifies the signature with slack_sdk's ``SignatureVerifier``, answers
200, and posts the text back in the thread with ``chat.postMessage`` through an
``AsyncWebClient`` with one shared aiohttp session, as the gateway's client has.

Each subject runs in its own subprocess, so its CPU time and peak RSS are its own. The fake
Slack Web API (``tests/fakes/slack_api.py``), the fake provider and the driver run in this
process, fresh fakes per run. The driver signs and POSTs each event to the subject. The
events are ``app_mention`` events in threads of one channel, one event per message (an app
subscribed to ``app_mention`` only). A message's latency runs from just before its POST to the fake
recording the bot's ``chat.postMessage`` in that thread. Scenarios:

(a) 20 threads x 10 messages, closed loop: each thread sends its next message once the
    previous one is answered (a different user per thread);
(b) 1 thread x 30 messages, the same loop in one thread.

Before each measured run, 3 messages in another thread warm the subject up.

Two floors, measured in the same rounds: the floor the targets are against is ``echo/llm``,
the same bare handler answering each message with one streamed ``chat.completions.create``
through the openai SDK against the same fake provider (the least an LLM bot does); the echo
handler itself stays in the report as context. Targets (issue 31): (a) throughput >= 0.85x
the floor's; (b) p50 latency <= 1.3x; CPU per message <= the floor's + 1.5 ms; peak RSS
<= 2x.
``--diagnose`` adds the gateway with the Anthropic SDK and with the in-process
``ScriptedProvider`` (the old subject) as diagnostic rows.

Run: .venv/bin/python bench/bench_slack.py [--rounds 7] [--profile] [--diagnose ROUNDS]
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
    percentile,
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
    Scenario("a", "closed loop, 20 threads x 10 messages", chats=20, per_chat=10),
    Scenario("b", "one thread x 30 messages", chats=1, per_chat=30),
)
CHANNEL = "C0BENCH"
WARM_THREAD = 999
WARM_MESSAGES = 3
SUBJECTS = ("echo", "echo/llm", "gateway")
VARIANTS = (
    ("gateway/no-reactions", "gateway without the :eyes: reaction (add and remove)"),
    ("gateway/no-preview", "gateway without a preview in the reply's first second"),
    ("gateway/lean", "gateway without both"),
    *PROVIDER_VARIANTS,
)
TARGETS = Targets(rate_ratio=0.85, p50_ratio=1.3, cpu_over_floor_ms=1.5, rss_ratio=2.0)
"""Diagnostics (``--diagnose``): the gateway with parts of its reply path switched off."""
PROFILE_GROUPS = (
    ("inbound POST /slack/events (aiohttp server, signature, bolt)", "aiohttp/web_protocol.py",
     "_handle_request"),
    ("... of which bolt's dispatch", "slack_bolt/app/async_app.py", "async_dispatch"),
    ("reactions.add (typing)", "slack_sdk/web/async_client.py", "reactions_add"),
    ("chat.postMessage (preview)", "slack_sdk/web/async_client.py", "chat_postMessage"),
    ("chat.update (final text)", "slack_sdk/web/async_client.py", "chat_update"),
    ("reactions.remove", "slack_sdk/web/async_client.py", "reactions_remove"),
    ("event worker: dedup, names, record the message", "slack/adapter.py", "_accept"),
    ("prompt build (persona cache check)", "gateway/persona/workspace.py", "build"),
    ("render Markdown -> mrkdwn", "slack/render.py", "render_chunks"),
    ("session log appends (JSONL)", "sessions/jsonl.py", "append"),
    *PROVIDER_PROFILE_GROUPS,
)
PREVIEW_AFTER = 1.0
"""no-preview: as ``channels.telegram.sink.TelegramTarget``'s ``preview_after`` (1 s)."""


def user_of(thread: int) -> str:
    return f"U{thread:07d}"


def threads_of(scenario: Scenario) -> list[int]:
    base = 1 if scenario.name == "a" else 101
    return [base + i for i in range(scenario.chats)]


# -- subjects (children) ----------------------------------------------------------------------

def apply_variant(variant: str) -> None:
    """Diagnostics only, in the child: switch off parts of the gateway's reply path."""
    if variant not in ("", "no-reactions", "no-preview", "lean", "anthropic", "scripted",
                       "fsync-off", "raw-http"):
        raise ValueError(f"unknown variant {variant!r}")
    from channels.slack.sink import SlackTarget

    if variant in ("no-reactions", "lean"):
        async def no_typing(self: SlackTarget) -> None:
            return None

        SlackTarget.typing = no_typing  # type: ignore[method-assign]
    if variant in ("no-preview", "lean"):
        shipped = SlackTarget.send_preview

        async def send_preview(self: SlackTarget, text: str) -> str | None:
            started: float | None = getattr(self, "bench_first_delta", None)
            if started is None:
                started = self.bench_first_delta = time.monotonic()  # type: ignore[attr-defined]
            if time.monotonic() - started < PREVIEW_AFTER:
                return None  # the streamer asks again with the next delta
            return await shipped(self, text)

        SlackTarget.send_preview = send_preview  # type: ignore[method-assign]


async def serve_gateway(cfg: dict[str, Any], stop: asyncio.Event, ready: Any) -> None:
    apply_variant(cfg.get("variant", ""))
    from app import logs
    from app.compose import build_gateway
    from app.config import Settings
    from app.server import freeze_heap

    settings = Settings(  # type: ignore[call-arg]  # _env_file: pydantic-settings init option
        _env_file=None,
        GATEWAY_DATA_DIR=cfg["data_dir"], GATEWAY_PORT=0, GATEWAY_CHANNELS="slack",
        GATEWAY_SHUTDOWN_GRACE=2, SLACK_BOT_TOKEN=cfg["bot_token"],
        SLACK_SIGNING_SECRET=cfg["signing_secret"], SLACK_API_BASE_URL=cfg["api_base_url"],
        SLACK_ALLOWED_USERS=cfg["allowed"], **provider_settings(cfg),
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
    import aiohttp
    from aiohttp import web
    from slack_sdk.signature import SignatureVerifier
    from slack_sdk.web.async_client import AsyncWebClient

    llm = LlmReplies(cfg) if cfg.get("variant") == "llm" else None
    verifier = SignatureVerifier(cfg["signing_secret"])
    session = aiohttp.ClientSession()
    client = AsyncWebClient(token=cfg["bot_token"], base_url=cfg["api_base_url"],
                            session=session)
    replies: set[asyncio.Task[Any]] = set()

    async def answer(event: dict[str, Any]) -> None:
        text = event.get("text", "")
        await client.chat_postMessage(
            channel=event["channel"], thread_ts=event.get("thread_ts") or event["ts"],
            text=text if llm is None else await llm.reply(text))

    async def events(request: web.Request) -> web.Response:
        raw = await request.read()
        if not verifier.is_valid(raw, request.headers.get("X-Slack-Request-Timestamp", ""),
                                 request.headers.get("X-Slack-Signature", "")):
            return web.Response(status=401)
        body = json.loads(raw)
        if body.get("type") == "url_verification":
            return web.json_response({"challenge": body.get("challenge")})
        event = body.get("event") or {}
        if event.get("type") == "app_mention" and not event.get("bot_id"):
            task = asyncio.create_task(answer(event))
            replies.add(task)
            task.add_done_callback(replies.discard)
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/slack/events", events)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        ready({"port": runner.addresses[0][1]})
        await stop.wait()
        if replies:
            await asyncio.wait(replies)
    finally:
        await runner.cleanup()
        await session.close()
        if llm is not None:
            await llm.aclose()


# -- driver -----------------------------------------------------------------------------------

def timed_fake() -> Any:
    from tests.fakes.slack_api import FakeSlackServer, JSONDict

    class TimedSlack(FakeSlackServer):
        """The fake, noting when each thread's reply is posted and when it is last edited.

        ``waiting[(channel, thread_ts)] = (future, started)``: the next chat.postMessage in
        that thread resolves the future with its time. ``final[ts]`` is the latency to the
        last write of that reply (its post, or a later chat.update of it)."""

        def __init__(self) -> None:
            super().__init__()
            self.waiting: dict[tuple[str, str], tuple[asyncio.Future[float], float]] = {}
            self.started: dict[str, float] = {}
            self.final: dict[str, float] = {}

        async def _chat_post_message(self, params: JSONDict) -> JSONDict:
            result = await super()._chat_post_message(params)
            now = time.perf_counter()
            entry = self.waiting.pop((str(params.get("channel")), str(params.get("thread_ts"))),
                                     None)
            if entry is not None and not entry[0].done():
                future, started = entry
                self.started[result["ts"]] = started
                self.final[result["ts"]] = now - started
                future.set_result(now)
            return result

        async def _chat_update(self, params: JSONDict) -> JSONDict:
            result = await super()._chat_update(params)
            started = self.started.get(str(params.get("ts")))
            if started is not None:
                self.final[str(params.get("ts"))] = time.perf_counter() - started
            return result

    return TimedSlack()


async def run_one(subject: str, scenario: Scenario, round_no: int, *,
                  profile: str | None = None) -> Run:
    threads = threads_of(scenario)
    allowed = ",".join(user_of(t) for t in [WARM_THREAD, *threads])
    with tempfile.TemporaryDirectory(prefix="bench-slack-") as tmp:
        async with timed_fake() as fake, fake_provider() as provider:
            loop = asyncio.get_running_loop()
            fake.add_channel(CHANNEL, name="bench")
            roots = {t: fake.next_ts() for t in [WARM_THREAD, *threads]}
            url = ""

            async def send(thread: int, i: int) -> float:
                root = roots[thread]
                envelope = fake.mention_events(user_of(thread), f"message {i} in thread {thread}",
                                               CHANNEL, thread_ts=root)[0]
                future: asyncio.Future[float] = loop.create_future()
                started = time.perf_counter()
                fake.waiting[(CHANNEL, root)] = (future, started)
                status, body = await fake.deliver_event(url, envelope)
                if status != 200:
                    raise RuntimeError(f"{subject}: events POST answered {status} {body}")
                return await future - started

            config = {"bot_token": fake.bot_token, "signing_secret": fake.signing_secret,
                      "api_base_url": fake.api_base_url, "allowed": allowed,
                      "data_dir": str(Path(tmp) / "data"), "profile": profile,
                      "provider_base_url": provider.base_url}
            log = Path(tmp) / f"{subject.replace('/', '-')}.log"
            async with Child(Path(__file__), subject, config, log) as child:
                url = f"http://127.0.0.1:{child.info['port']}/slack/events"
                async with asyncio.timeout(30):
                    for i in range(WARM_MESSAGES):
                        await send(WARM_THREAD, i)
                if profile:
                    child.signal(signal.SIGUSR1)
                before = len(fake.calls)
                fake.started.clear()
                fake.final.clear()
                async with asyncio.timeout(120):
                    run = await closed_loop(child, subject, scenario.name, send, threads,
                                            scenario.per_chat)
            errors = [c for c in fake.calls if not c.ok]
            posts = len(fake.calls_of("chat.postMessage"))
            expected = WARM_MESSAGES + scenario.chats * scenario.per_chat
            if errors or posts != expected:
                raise RuntimeError(f"{subject}: {posts} chat.postMessage (expected {expected}), "
                                   f"errors {[(c.method, c.error) for c in errors]}; "
                                   f"log:\n{log.read_text()[-3000:]}")
            run.extra["calls_per_message"] = (len(fake.calls) - before) / run.messages
            check_provider_calls(subject, provider, expected)
            finals = list(fake.final.values())
            run.extra["final_p50"] = percentile(finals, 50)
            run.extra["final_p99"] = percentile(finals, 99)
            return run


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--profile", action="store_true",
                        help="after the rounds, one cProfile'd gateway run per scenario")
    parser.add_argument("--diagnose", type=int, default=0, metavar="ROUNDS",
                        help="after the rounds, this many rounds of the gateway against "
                             "variants with parts of its reply path switched off")
    args = parser.parse_args()
    started = time.perf_counter()
    load_before = os.getloadavg()

    async def one(subject: str, scenario: Scenario, round_no: int) -> Run:
        return await run_one(subject, scenario, round_no)

    runs = await alternate(args.rounds, SCENARIOS, SUBJECTS, one)
    tables, _ = report_tables(
        runs, SCENARIOS, "gateway", LLM_FLOOR, TARGETS, context="echo",
        extra_rows=[("time to the final text, p50 (ms; the reply's last post or edit)",
                     "final_p50", 1e3),
                    ("time to the final text, p99 (ms)", "final_p99", 1e3)])
    calls = {s: sorted(r.extra["calls_per_message"] for r in runs if r.subject == s)
             for s in SUBJECTS}
    command = (f".venv/bin/python bench/bench_slack.py --rounds {args.rounds}"
               + (" --profile" if args.profile else "")
               + (f" --diagnose {args.diagnose}" if args.diagnose else ""))
    lines = [
        "## Slack path: gateway vs a bare aiohttp + slack_sdk echo", "",
        f"`{command}` (ELAPSED s)", "",
        machine_line(load_before), "",
        cpu_check_line(runs), "",
        "The gateway answers through the real openai SDK, streaming from a local fake "
        "provider server in the driver process.", "",
        f"Medians of {args.rounds} rounds; ratios are medians of per-round ratios (the "
        "subjects alternate, order flipped every round). The targets are against `echo/llm`, "
        "the bare bot answering through one streamed provider call with the same SDK; the "
        "bare echo is context. Each run uses a fresh subprocess per "
        "subject and a fresh fake Slack (in the driver process, which also signs and POSTs "
        "the events). Latency is from just before the events POST to the fake recording the "
        "reply's chat.postMessage. p99 is interpolated (of 200 samples in (a), 30 in (b)).", "",
        "Web API calls per message (all methods): "
        + ", ".join(f"{s} {calls[s][len(calls[s]) // 2]:.2f}" for s in SUBJECTS) + ".", "",
        *tables,
    ]
    async def profiled(scenario: Scenario, path: str) -> Run:
        return await run_one("gateway", scenario, 0, profile=path)

    lines += await platform_sections(args, "slack", SCENARIOS, TARGETS, VARIANTS,
                                     PROFILE_GROUPS, one, profiled)
    report = ("\n".join(lines) + "\n").replace(
        "ELAPSED", f"{time.perf_counter() - started:.0f}", 1)
    print(report)
    write_report("slack.md", report)


if __name__ == "__main__":
    if "--serve" in sys.argv:
        serve_child(serve_gateway, serve_echo)
    else:
        asyncio.run(main())
