"""How a turn ends: its session's fsync runs while the reply is on its way, so neither the
reply nor (for the time the send takes) the conversation's next message waits for it."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

from sessions.jsonl import JsonlSessionStore
from tests.fakes.disk import FaultyDisk
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.harness import running_core
from tests.waiting import WAIT


class HeldSync(FaultyDisk):
    """The real disk; an fsync notes that it began, then waits until released."""

    def __init__(self) -> None:
        super().__init__()
        self.began = threading.Event()
        self.release = threading.Event()

    def fsync(self, fd: int) -> None:
        self.began.set()
        self.release.wait(30)  # bounded: a test that fails must not hang the suite
        os.fsync(fd)


async def test_the_fsync_runs_while_the_reply_is_sent(tmp_path: Path) -> None:
    disk = HeldSync()
    provider = ScriptedProvider()
    provider.script("hello!")
    async with running_core(JsonlSessionStore(tmp_path / "d", ops=disk), provider,
                            tmp_path / "p") as core:
        core.channel.send_gate = asyncio.Event()
        try:
            await core.channel.say("c1", "hi")
            await asyncio.wait_for(core.channel.holding.wait(), WAIT)
            # The reply is held on its way; the turn's fsync has begun all the same.
            assert await asyncio.to_thread(disk.began.wait, 10)
            assert core.channel.replies == []
        finally:
            disk.release.set()
            core.channel.send_gate.set()
        assert await core.channel.wait_replies(1) == [("c1", "finish", "hello!")]
        await core.idle()
