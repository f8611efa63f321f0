"""Message windows: budget, tool-round safety, and the indexed chooser matching the reference."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.agent.conversation import conversation_order
from gateway.agent.window import ConversationOrder, choose_window, estimate_tokens, to_ranges


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str, tool: bool = False) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}]
    if tool:
        blocks.append({"type": "tool_use", "id": "t", "name": "x", "input": {}})
    return {"role": "assistant", "content": blocks}


def result() -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                         "content": "ok"}]}


def test_window_never_starts_on_orphan_tool_result() -> None:
    """When the budget cuts into a tool round, the window moves forward to a plain user turn."""
    messages = [user("a" * 40), assistant("b", tool=True), result(), assistant("c" * 40),
                user("d")]
    order = ConversationOrder()
    for i, m in enumerate(messages):
        order.append(i, estimate_tokens(m))
    budget = sum(estimate_tokens(m) for m in messages[2:])
    assert order.choose(messages, budget) == ((4, 5),)
    assert order.choose(messages, 10_000) == ((0, 5),)


def test_window_never_ends_on_unanswered_tool_use() -> None:
    """A crashed turn's trailing tool_use is left out of the next window."""
    messages = [user("a"), assistant("b", tool=True)]
    order = ConversationOrder()
    for i, m in enumerate(messages):
        order.append(i, estimate_tokens(m))
    assert order.choose(messages, 10_000) == ((0, 1),)


def test_resumed_order_defers_message_recorded_mid_round() -> None:
    """A user message logged inside another turn's tool round joins after that turn's answer."""
    messages = [user("q1"), assistant("", tool=True), user("q2"), result(), assistant("a1"),
                assistant("a2")]
    assert conversation_order(messages) == [0, 1, 3, 4, 2, 5]
    assert to_ranges([0, 1, 3, 4, 2, 5]) == ((0, 2), (3, 5), (2, 3), (5, 6))


message_kinds = st.sampled_from(["user", "assistant", "tool_round", "result"])


@settings(max_examples=300, deadline=None)
@given(
    kinds=st.lists(message_kinds, min_size=1, max_size=40),
    costs=st.lists(st.integers(1, 50), min_size=40, max_size=40),
    budget=st.integers(1, 400),
    shuffle=st.lists(st.integers(0, 39), max_size=6),
)
def test_indexed_chooser_equals_reference(kinds: list[str], costs: list[int], budget: int,
                                          shuffle: list[int]) -> None:
    """ConversationOrder.choose gives exactly the linear reference's window."""
    build = {"user": lambda: user("u"), "assistant": lambda: assistant("a"),
             "tool_round": lambda: assistant("t", tool=True), "result": result}
    messages = [build[k]() for k in kinds]
    order_list = list(range(len(messages)))
    for i in shuffle:  # move some messages later, as mid-turn arrivals are
        if i < len(order_list):
            order_list.append(order_list.pop(i))
    order = ConversationOrder()
    for index in order_list:
        order.append(index, costs[index])
    assert order.choose(messages, budget) == choose_window(messages, order_list, costs, budget)


def test_photos_count_by_size_so_a_window_stays_under_request_limits() -> None:
    """Each 3 MB photo costs about a token per KB: with the default 16,000-token budget a
    window carries five of them (about 21 MB of base64), never all twelve (over 32 MB)."""
    from sessions.attachments import BlobRef, ref_block

    size = 3 * 1024 * 1024
    messages: list[dict[str, Any]] = []
    for n in range(12):
        ref = BlobRef(f"{n:064x}", f"p{n}.jpg", "image/jpeg", size)
        messages += [{"role": "user", "content": [ref_block(ref)]}, assistant("a photo")]
    small = BlobRef("f" * 64, "icon.png", "image/png", 2000)
    assert estimate_tokens({"role": "user", "content": [ref_block(small)]}) == 1600 + 8
    order = ConversationOrder()
    for i, m in enumerate(messages):
        order.append(i, estimate_tokens(m))
    window = order.choose(messages, 16_000)
    photos = sum(1 for a, b in window for i in range(a, b) if messages[i]["role"] == "user")
    assert photos == 5
