"""Choosing which messages a provider call sees: a token budget over the conversation's tail.

Rules: the newest message is always sent; older ones are added while the estimated token count
stays within the budget; the window never starts on a user message that only carries tool
results (its tool_use would be missing) nor on an assistant message, and never ends on an
assistant tool_use without its results. The result is a list of half-open index ranges into
the session's message list, in conversation order (which can differ from log order when a
message arrived during another turn, see :mod:`gateway.conversation`).
"""

from __future__ import annotations

from collections.abc import Sequence

from sessions.records import MessageDict, Window

CHARS_PER_TOKEN = 4


def estimate_tokens(message: MessageDict) -> int:
    """A cheap, provider-neutral estimate (about 4 characters a token) plus framing."""
    content = message["content"]
    if isinstance(content, str):
        return len(content) // CHARS_PER_TOKEN + 4
    size = 0
    for block in content:
        for key in ("text", "content", "input"):
            value = block.get(key)
            if value is not None:
                size += len(value) if isinstance(value, str) else len(repr(value))
    return size // CHARS_PER_TOKEN + 4 * len(content) + 4


def is_plain_user(message: MessageDict) -> bool:
    """A user message a window may start with: text, not tool results."""
    if message["role"] != "user":
        return False
    content = message["content"]
    if isinstance(content, str):
        return True
    return not any(b.get("type") == "tool_result" for b in content)


def has_tool_use(message: MessageDict) -> bool:
    content = message["content"]
    return message["role"] == "assistant" and isinstance(content, list) and any(
        b.get("type") == "tool_use" for b in content
    )


def choose_window(
    messages: Sequence[MessageDict],
    order: Sequence[int],
    costs: Sequence[int],
    budget: int,
) -> Window:
    """Ranges of ``order``'s tail that fit ``budget``; ``costs[i]`` estimates message ``i``."""
    if not order:
        return ()
    end = len(order)
    while end > 1 and has_tool_use(messages[order[end - 1]]):
        end -= 1  # an unanswered tool_use can only be the tail of a crashed turn
    start = end - 1
    total = costs[order[start]]
    while start > 0 and total + costs[order[start - 1]] <= budget:
        start -= 1
        total += costs[order[start]]
    # Move forward to a safe first message; if none, keep the newest message alone.
    first = start
    while first < end - 1 and not is_plain_user(messages[order[first]]):
        first += 1
    if not is_plain_user(messages[order[first]]):
        first = start
    return to_ranges(order[first:end])


def to_ranges(indices: Sequence[int]) -> Window:
    """Compress a list of indices into half-open runs: [3,4,5,9] -> ((3,6),(9,10))."""
    ranges: list[tuple[int, int]] = []
    for i in indices:
        if ranges and ranges[-1][1] == i:
            ranges[-1] = (ranges[-1][0], i + 1)
        else:
            ranges.append((i, i + 1))
    return tuple(ranges)
