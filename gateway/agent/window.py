"""Choosing which messages a provider call sees: a token budget over the conversation's tail.

Rules: the newest message is always sent; older ones are added while the estimated token count
stays within the budget; the window never starts on a user message that only carries tool
results (its tool_use would be missing) nor on an assistant message, and never ends on an
assistant tool_use without its results. The result is a list of half-open index ranges into
the session's message list, in conversation order (which can differ from log order when a
message arrived during another turn, see :mod:`gateway.agent.conversation`).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence

from sessions.attachments import category, ref_of
from sessions.records import MessageDict, Window

CHARS_PER_TOKEN = 4
IMAGE_TOKENS = 1600
"""About what a provider charges for an image at its largest useful size."""
IMAGE_BYTES_PER_TOKEN = 1000
"""Images count at least a token per KB as well, so the images a window carries stay within
about ``window_tokens`` KB (16 MB for the default budget): a request body that size, base64
included, is well under the providers' limits (32 MB for Anthropic)."""
PDF_BYTES_PER_TOKEN = 100
"""A rough rate for PDFs (pages are read as text and as images); at least one image's worth."""


def estimate_tokens(message: MessageDict) -> int:
    """A cheap, provider-neutral estimate (about 4 characters a token) plus framing."""
    content = message["content"]
    if isinstance(content, str):
        return len(content) // CHARS_PER_TOKEN + 4
    size = 0
    for block in content:
        ref = ref_of(block)
        if ref is not None:
            size += _attachment_chars(block, ref.media_type, ref.size)
            continue
        for key in ("text", "content", "input"):
            value = block.get(key)
            if value is not None:
                size += len(value) if isinstance(value, str) else len(repr(value))
    return size // CHARS_PER_TOKEN + 4 * len(content) + 4


def _attachment_chars(block: MessageDict, media_type: str, size: int) -> int:
    """An attachment's estimate, in characters (the unit the rest of the estimate uses)."""
    transcript = block.get("transcript")
    if isinstance(transcript, str):
        return len(transcript)
    kind = category(media_type)
    if kind == "image":
        return max(IMAGE_TOKENS, size // IMAGE_BYTES_PER_TOKEN) * CHARS_PER_TOKEN
    if kind == "pdf":
        return max(IMAGE_TOKENS, size // PDF_BYTES_PER_TOKEN) * CHARS_PER_TOKEN
    return size  # text files: about one character a byte


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


class ConversationOrder:
    """The conversation's messages in conversation order, indexed for O(log n) windows.

    Keeps the order as runs of consecutive log indices (usually one run, more when a message
    arrived during another turn) and prefix sums of token estimates, so choosing a window does
    not walk the whole transcript on every provider call.
    """

    __slots__ = ("_cum", "_run_pos", "_runs", "order")

    def __init__(self) -> None:
        self.order: list[int] = []
        self._cum: list[int] = [0]
        self._runs: list[list[int]] = []  # [first, end) log-index runs
        self._run_pos: list[int] = []  # position in ``order`` where each run starts

    def __len__(self) -> int:
        return len(self.order)

    def __contains__(self, index: object) -> bool:
        # Runs are few (one, plus one per message that arrived during another turn).
        return isinstance(index, int) and any(first <= index < end for first, end in self._runs)

    def append(self, index: int, cost: int) -> None:
        if self._runs and self._runs[-1][1] == index:
            self._runs[-1][1] = index + 1
        else:
            self._runs.append([index, index + 1])
            self._run_pos.append(len(self.order))
        self.order.append(index)
        self._cum.append(self._cum[-1] + cost)

    def tokens(self, start: int, end: int) -> int:
        """Estimated tokens of the messages at order positions ``[start, end)``."""
        return self._cum[end] - self._cum[start]

    def tail_end(self, messages: Sequence[MessageDict]) -> int:
        """Where the next window ends: past the last message, unless that is an unanswered
        tool_use (only the tail of a crashed turn can be)."""
        end = len(self.order)
        while end > 1 and has_tool_use(messages[self.order[end - 1]]):
            end -= 1
        return end

    def choose(self, messages: Sequence[MessageDict], budget: int, floor: int = 0) -> Window:
        """The window for the next call: see the module docstring for the rules. Positions
        before ``floor`` (messages a summary stands for) are never chosen."""
        order = self.order
        if not order or floor >= len(order):
            return ()
        end = self.tail_end(messages)
        floor = min(floor, end - 1)
        # Smallest start with cum[end] - cum[start] <= budget, keeping at least one message.
        start = min(bisect_left(self._cum, self._cum[end] - budget, floor, end), end - 1)
        first = start
        while first < end - 1 and not is_plain_user(messages[order[first]]):
            first += 1
        if not is_plain_user(messages[order[first]]):
            first = start
        return self._ranges(first, end)

    def plain_user_at(self, messages: Sequence[MessageDict], position: int) -> bool:
        """Whether a window may start at order position ``position``."""
        return is_plain_user(messages[self.order[position]])

    def ranges(self, first: int, end: int) -> Window:
        """Log-index ranges covering order positions ``[first, end)``."""
        return self._ranges(first, end)

    def _ranges(self, first: int, end: int) -> Window:
        """Ranges covering order positions [first, end), from the runs."""
        ranges: list[tuple[int, int]] = []
        r = bisect_right(self._run_pos, first) - 1
        while r < len(self._runs) and self._run_pos[r] < end:
            run_start, run_end = self._runs[r]
            pos = self._run_pos[r]
            lo = run_start + max(0, first - pos)
            hi = min(run_end, run_start + (end - pos))
            if lo < hi:
                ranges.append((lo, hi))
            r += 1
        return tuple(ranges)


def choose_window(
    messages: Sequence[MessageDict],
    order: Sequence[int],
    costs: Sequence[int],
    budget: int,
) -> Window:
    """Reference implementation (linear): same rules as :meth:`ConversationOrder.choose`."""
    if not order:
        return ()
    end = len(order)
    while end > 1 and has_tool_use(messages[order[end - 1]]):
        end -= 1
    start = end - 1
    total = costs[order[start]]
    while start > 0 and total + costs[order[start - 1]] <= budget:
        start -= 1
        total += costs[order[start]]
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
