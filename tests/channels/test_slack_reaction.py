"""The :eyes: reaction that stands for "typing" on Slack is always taken back, also when the
reply is ready while its ``reactions.add`` is still on its way (the streamer stops typing
then, and a request cut off mid-way may still reach Slack after the removal: found as
``reactions.remove failed: no_reaction`` in a benchmark run on a busy machine, with the
reaction left on the person's message). Against the local fake driven by slack_sdk."""

from __future__ import annotations

from channels.slack.convert import META_TS
from channels.slack.sink import SlackCalls, SlackTarget
from channels.streaming import EditStreamer
from gateway.edge.messages import Inbound
from tests.fakes.slack_api import FakeSlackServer
from tests.waiting import until

USER = "U0ALICE"


def methods(fake: FakeSlackServer) -> list[str]:
    return [call.method for call in fake.calls]


async def test_reply_ready_while_the_reaction_is_being_added_takes_it_back(
    slack: tuple[FakeSlackServer, SlackCalls, Inbound],
) -> None:
    fake, calls, inbound = slack
    gate = fake.hold_next("reactions.add")
    sink = EditStreamer(SlackTarget(calls, inbound), min_interval=0.0, typing_delay=0.001,
                        typing_interval=60.0)
    await sink.typing()
    await until(lambda: fake.held_now == ["reactions.add"], what="the reaction on its way")
    await sink.finish("the answer")  # the reply is out; the end of the turn waits for nothing
    assert [(c.method, c.error) for c in fake.calls] == [("chat.postMessage", None)]
    gate.set()
    await until(lambda: "reactions.remove" in methods(fake), what="the reaction taken back")
    assert [(c.method, c.error) for c in fake.calls] == [
        ("chat.postMessage", None), ("reactions.add", None), ("reactions.remove", None)]
    assert fake.reactions == {(inbound.key.chat, inbound.meta[META_TS]): set()}


async def test_a_reaction_that_failed_is_not_taken_back_and_is_tried_again(
    slack: tuple[FakeSlackServer, SlackCalls, Inbound],
) -> None:
    fake, calls, inbound = slack
    fake.fail_next("reactions.add", "ratelimited")
    target = SlackTarget(calls, inbound)
    await target.typing()
    await target.typing()  # the next renewal
    await target.deliver_final("the answer", None)
    assert [(c.method, c.error) for c in fake.calls] == [
        ("reactions.add", "ratelimited"), ("reactions.add", None), ("chat.postMessage", None),
        ("reactions.remove", None)]
    assert fake.reactions == {(inbound.key.chat, inbound.meta[META_TS]): set()}
