"""A refused-file notice and a budget refusal survive a SIGKILL without being sent twice.

`gateway run` (a subprocess; Telegram by long polling against the fake) is killed from
inside the fake Telegram at the one instant these answers are most exposed: the notice or
the refusal was just put into its message (the fake applied the call, the gateway has not
heard back, so the item is not marked answered). Started again on the same data directory,
the gateway finds the recorded notice or refusal and puts it into the same message (an edit),
sends no new message for it and asks neither the model nor the limits again. A later message
in the same chat, answered, is the sign that the owed item was served by then (a chat's
messages are served in order).

The in-process versions (the journal refusing the ``paid`` line instead of a kill) are in
``tests/gateway/test_reconcile.py``; this one kills the real process.
"""

from __future__ import annotations

import asyncio
import random
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.providers import FakeProviderServer
from tests.fakes.slack_api import FakeSlackServer
from tests.fakes.telegram_api import FakeTelegramServer
from tests.ports import free_port
from tests.reliability.crash_harness import (
    TG_USERS,
    GatewayProcess,
    SlowEcho,
    gateway_env,
    telegram_input,
)
from tests.waiting import until

NOTICE = "I couldn't use"
REFUSAL = "You've used up today's allowance"
SIGN_TIMEOUT = 120.0
"""Seconds for a sign the test waits on (an answer, the kill): generous for a busy machine."""

Call = tuple[str, int | None, str]
"""``(method, message id, text)`` of a reply call the fake Telegram applied."""


class Killer:
    """The fake Telegram's tap: records every applied reply call and SIGKILLs the gateway
    right after the first one whose text starts with ``prefix`` was applied."""

    def __init__(self, gateway: GatewayProcess, prefix: str) -> None:
        self.gateway = gateway
        self.prefix = prefix
        self.calls: list[Call] = []
        self.killed = asyncio.Event()
        self.armed = True

    def __call__(self, phase: str, method: str, params: Mapping[str, Any], result: Any) -> None:
        if phase != "after" or method not in ("sendmessage", "editmessagetext"):
            return
        message_id = params.get("message_id")
        if message_id is None and isinstance(result, Mapping):
            message_id = result.get("message_id")
        text = str(params.get("text") or "")
        self.calls.append((method, None if message_id is None else int(message_id), text))
        if self.armed and text.startswith(self.prefix):
            self.armed = False
            self.gateway.signal_now(signal.SIGKILL)
            self.killed.set()


def bot_texts(tg: FakeTelegramServer, chat: int) -> dict[int, str]:
    """The bot's messages in ``chat`` as they stand (edits applied): id -> text."""
    return {mid: str(m.get("text", "")) for (c, mid), m in tg.messages.items()
            if c == chat and m["from"]["id"] == tg.bot_user["id"]}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("answer", ["notice", "refusal"])
async def test_a_notice_or_refusal_survives_a_kill_without_being_sent_twice(
        answer: str, tmp_path: Path) -> None:
    """Killed right after a refused-file notice (or a budget refusal) went into its message,
    the next start edits that same message with the recorded text: one notice (refusal) on
    the platform, no new message for it, no model call for it."""
    chat = TG_USERS[0]
    async with FakeTelegramServer() as tg, FakeSlackServer() as slack, \
            FakeProviderServer() as llm:
        echo = SlowEcho(random.Random(0), low=0.0, high=0.01)
        llm.default = echo
        models: list[str] = []
        echo.on_call = models.append
        port = free_port()
        env = gateway_env(tmp_path / "data", port, tg, slack, llm) | {
            "GATEWAY_CHANNELS": "telegram",
            "GATEWAY_MAX_ATTACHMENT_BYTES": "1000",
            # One token a day: the first answer spends it, the next message is refused.
            "GATEWAY_BUDGET_USER_TOKENS": "1",
        }
        gateway = GatewayProcess(env, cwd=tmp_path, log_dir=tmp_path, port=port)
        await telegram_input(gateway, tg, "polling")
        killer = Killer(gateway, NOTICE if answer == "notice" else REFUSAL)
        tg.outbound.tap = killer
        try:
            await gateway.start()
            if answer == "notice":
                tg.user_media(chat, "document", b"%PDF-1.4 " + b"x" * 4000,
                              file_name="scan.pdf", mime_type="application/pdf")
            else:
                tg.user_message(chat, "hello tok00001")
                await until(lambda: any("[end tok00001]" in t
                                        for t in bot_texts(tg, chat).values()),
                            SIGN_TIMEOUT, "the first message answered")
                tg.user_message(chat, "and again tok00002")
            async with asyncio.timeout(SIGN_TIMEOUT):
                await killer.killed.wait()
            await gateway.exited()
            before = dict(bot_texts(tg, chat))
            [(_, exposed, text)] = [c for c in killer.calls if c[2].startswith(killer.prefix)]
            assert exposed is not None
            calls_before = len(killer.calls)

            await gateway.start()
            # The sign: a later message in the chat, answered (a notice case's marker is
            # answered by the model; a refusal case's is refused again, as it should be).
            tg.user_message(chat, "later tok00003")
            sign = "[end tok00003]" if answer == "notice" else REFUSAL
            await until(lambda: any(sign in c[2] for c in killer.calls[calls_before:]),
                        SIGN_TIMEOUT, "the later message answered")
            assert await gateway.stop() == 0
        finally:
            tg.outbound.tap = None
            await gateway.kill()
        after = bot_texts(tg, chat)
        again = killer.calls[calls_before:]

    # The exposed message holds the answer, as before; no other message holds it (but the
    # later message's own refusal).
    assert after[exposed] == text == before[exposed]
    # (A later refusal says the time left in other words: matched by its start.)
    holding = [mid for mid, t in after.items() if t.startswith(killer.prefix)]
    expected = [exposed] if answer == "notice" else [exposed, max(after)]
    assert holding == expected, after
    # After the restart: the exposed message was edited (or left as it was), never sent
    # again; the only new message is the later one's.
    sent_again = [c for c in again if c[0] == "sendmessage"]
    assert all(c[1] != exposed for c in sent_again), again
    assert {c[1] for c in sent_again} <= {max(after)}, again
    # No model call for the notice or the refusal, before or after the kill.
    expected_models = ["tok00003"] if answer == "notice" else ["tok00001"]
    assert models == expected_models, models
