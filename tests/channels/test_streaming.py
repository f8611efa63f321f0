"""EditStreamer: previews throttled by a (fake) clock, the final text replaces them."""

from __future__ import annotations

import asyncio

from channels.streaming import EditStreamer


class Target:
    """Records what the streamer asks the platform to do, with the fake time of each call."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.calls: list[tuple[str, float, str]] = []

    async def typing(self) -> None:
        self.calls.append(("typing", self.clock[0], ""))

    async def send_preview(self, text: str) -> str | None:
        self.calls.append(("send", self.clock[0], text))
        return "m1"

    async def edit_preview(self, ref: str, text: str) -> None:
        self.calls.append(("edit", self.clock[0], text))

    async def deliver_final(self, text: str, preview: str | None) -> None:
        self.calls.append(("final", self.clock[0], f"{preview}:{text}"))


async def test_previews_are_at_least_the_interval_apart() -> None:
    """Deltas every 0.03 s with a 0.15 s interval: a preview at 0, then one edit per 0.15 s
    (each showing everything so far), then the final text replacing the preview."""
    now = [0.0]
    target = Target(now)
    sink = EditStreamer(target, min_interval=0.15, typing_delay=10.0, clock=lambda: now[0])
    for i in range(20):  # t = 0.00, 0.03, ..., 0.57
        now[0] = round(i * 0.03, 2)
        await sink.delta(f"w{i} ")
    await sink.finish("all done")
    previews = [(kind, at) for kind, at, _ in target.calls if kind in ("send", "edit")]
    assert previews == [("send", 0.0), ("edit", 0.15), ("edit", 0.3), ("edit", 0.45)]
    assert target.calls[-1] == ("final", 0.57, "m1:all done")
    assert target.calls[1][2].startswith("w0 w1 w2 w3 w4 w5 ")


async def test_a_quick_reply_sends_no_preview() -> None:
    """Within ``preview_after`` nothing is sent until the final text."""
    now = [0.0]
    target = Target(now)
    sink = EditStreamer(target, min_interval=0.0, preview_after=1.0, typing_delay=10.0,
                        clock=lambda: now[0])
    for i in range(5):
        now[0] = i * 0.1
        await sink.delta("x")
    await sink.finish("xxxxx")
    assert [kind for kind, _, _ in target.calls] == ["final"]


async def test_a_reply_ready_before_the_typing_delay_shows_none_and_runs_no_task() -> None:
    """Until the indicator first shows it is a timer, not a task: a reply ready sooner sends no
    typing action, and nothing was started that the reply must stop and wait for."""
    target = Target([0.0])
    sink = EditStreamer(target, typing_delay=10.0)
    before = asyncio.all_tasks()
    await sink.typing()
    assert asyncio.all_tasks() == before
    await sink.finish("done")
    assert [kind for kind, _, _ in target.calls] == ["final"]
    assert asyncio.all_tasks() == before


async def test_typing_shows_after_the_delay_and_stops_with_the_reply() -> None:
    """Past the delay the indicator shows (and would be renewed every interval); the reply
    stops it, and nothing of it is left running."""
    shown = asyncio.Event()

    class Shown(Target):
        async def typing(self) -> None:
            await super().typing()
            shown.set()

    target = Shown([0.0])
    sink = EditStreamer(target, typing_delay=0.01, typing_interval=60.0)
    before = asyncio.all_tasks()
    await sink.typing()
    await sink.typing()  # asked again while pending: still one indicator
    await asyncio.wait_for(shown.wait(), 30)
    await sink.finish("done")
    assert [kind for kind, _, _ in target.calls] == ["typing", "final"]
    assert asyncio.all_tasks() == before
