"""Server-sent events of a streamed answer, read for the SDK stream classes of both providers.

The SDKs decode a streamed answer through several nested async generators per call (their
stream's ``__stream__`` and ``_iter_events``, the SSE decoder's ``aiter_bytes``, httpx2's
``Response.aiter_bytes``), a Python line splitter and a ``ServerSentEvent`` object per event;
the OpenAI stream also leaves three of those generators suspended when it stops at ``[DONE]``,
which asyncio then finalises through ``call_soon_threadsafe`` (a self-pipe wake-up and a task
each, per call). :class:`SseReader` reads the same body with one iterator, httpx2's
``Response.aiter_bytes`` (so content decoding stays httpx2's), which it always closes or runs to
its end, and decodes whole blocks of lines at once.

What it yields is what the SDKs' decoders yield, event for event (a test compares them on
generated streams cut at every byte): lines end at CR, LF or CRLF (also when a CRLF is split
between two reads); a blank line dispatches the event if a field was set (the last event id
is kept across events, as the SDKs keep it); comment lines and unknown fields are skipped; a
line that is not UTF-8 raises the ``UnicodeDecodeError`` the SDKs raise, after the events
before it; an event not closed by a blank line when the body ends is dropped. :func:`loads`
parses data as ``json.loads`` does (orjson, with Python's parser wherever orjson would read
something differently).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Self, TypeVar

import httpx2
import orjson

T = TypeVar("T")
Sse = tuple[str | None, str]
"""One dispatched event: its name (None when it had none) and its data lines joined by LF."""

# orjson reads an integer of 19 digits or more past 64 bits as a float (json.loads: an int);
# a run that long anywhere in the data (in a string too) sends it to Python's parser.
_LONG_NUMBER = re.compile(r"[0-9]{19}")

DRAIN_SECONDS = 0.1
"""How long the rest of a body is read after ``[DONE]`` (the OpenAI SDK's drain bound)."""


def loads(data: str) -> Any:
    """``json.loads(data)``: the same value, or the same exception."""
    if _LONG_NUMBER.search(data) is None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # NaN, Infinity, lone surrogates, errors: Python's parser decides
    return json.loads(data)


class SseDecoder:
    """Bytes in, dispatched events out; incremental, pure (the SDKs' ``SSEDecoder``, by blocks).

    :meth:`feed` takes the body's chunks as they come, :meth:`finish` its end. Once a line was
    not UTF-8, :attr:`failure` holds the error and the decoder takes nothing more.
    """

    __slots__ = ("_cr", "_data", "_event", "_last_id", "_pending", "_retry", "failure")

    def __init__(self) -> None:
        self._pending: list[bytes] = []  # the start of a line not ended yet
        self._cr = False  # the last chunk ended in CR: an LF opening the next one ends no line
        self._event: str | None = None
        self._data: list[str] = []
        self._last_id: str | None = None
        self._retry: int | None = None
        self.failure: UnicodeDecodeError | None = None

    def feed(self, chunk: bytes) -> list[Sse]:
        """The events that ``chunk`` completes, in order."""
        if self.failure is not None or not chunk:
            return []
        if self._cr:
            self._cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if b"\r" in chunk:
            self._cr = chunk[-1:] == b"\r"
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        end = chunk.rfind(b"\n")
        if end < 0:
            if chunk:
                self._pending.append(chunk)
            return []
        block = chunk[:end]
        if self._pending:
            self._pending.append(block)
            block = b"".join(self._pending)
            self._pending.clear()
        if end + 1 < len(chunk):
            self._pending.append(chunk[end + 1:])
        try:
            lines = block.decode().split("\n")
        except UnicodeDecodeError:
            return self._checked(block.split(b"\n"))
        return self._lines(lines)

    def finish(self) -> None:
        """The body ended: a last line without its line end is read (and can fail), never
        dispatched (an event needs its blank line)."""
        if self.failure is None and self._pending:
            self._checked([b"".join(self._pending)])
            self._pending.clear()

    def _checked(self, raw: list[bytes]) -> list[Sse]:
        """Line by line, to stop at the very line that is not UTF-8 (as the SDKs do)."""
        lines: list[str] = []
        for line in raw:
            try:
                lines.append(line.decode())
            except UnicodeDecodeError as exc:
                self.failure = exc
                break
        return self._lines(lines)

    def _lines(self, lines: list[str]) -> list[Sse]:
        events: list[Sse] = []
        for line in lines:
            if line.startswith("data: "):  # nearly every line of an answer
                self._data.append(line[6:])
                continue
            if not line:
                if self._event or self._data or self._last_id or self._retry is not None:
                    events.append((self._event or None, "\n".join(self._data)))
                    self._event = None
                    self._data = []
                    self._retry = None
                continue
            if line[0] == ":":
                continue
            name, _, value = line.partition(":")
            if value[:1] == " ":
                value = value[1:]
            if name == "data":
                self._data.append(value)
            elif name == "event":
                self._event = value
            elif name == "id":
                if "\0" not in value:
                    self._last_id = value
            elif name == "retry":
                with contextlib.suppress(ValueError):  # ignored, as the SDKs ignore it
                    self._retry = int(value)
        return events


class SseReader:
    """The events of one streamed response body, in order.

    Owns the body's one iterator (httpx2's ``Response.aiter_bytes``): read to its end, or
    closed by :meth:`aclose` (idempotent), so no generator is left for asyncio to finalise.
    Transport errors come out of :meth:`next` as httpx2 raised them.
    """

    __slots__ = ("_chunks", "_decoder", "_ended", "_ready")

    def __init__(self, response: httpx2.Response) -> None:
        self._chunks = response.aiter_bytes()
        self._decoder = SseDecoder()
        self._ready: deque[Sse] = deque()
        self._ended = False

    async def next(self) -> Sse | None:
        """The next event; None once the body has ended."""
        ready = self._ready
        decoder = self._decoder
        while not ready:
            if decoder.failure is not None:
                raise decoder.failure
            if self._ended:
                return None
            try:
                chunk = await anext(self._chunks)
            except StopAsyncIteration:
                self._ended = True
                decoder.finish()
                continue
            ready.extend(decoder.feed(chunk))
        return ready.popleft()

    async def drain(self) -> None:
        """Read and drop the rest of the body for at most :data:`DRAIN_SECONDS`, so an HTTP/1.1
        connection can be reused (the OpenAI SDK does this after ``[DONE]``); a failure here is
        not the answer's."""
        if self._ended:
            return
        self._ended = True
        try:
            async with asyncio.timeout(DRAIN_SECONDS):
                async for _ in self._chunks:
                    pass
        except (TimeoutError, httpx2.RequestError):
            pass

    async def aclose(self) -> None:
        """Close the body's iterator (and with it the response)."""
        self._ended = True
        await self._chunks.aclose()


END: Any = object()
"""What a stream's item function returns when the answer has ended."""

ItemOf = Callable[[SseReader], Awaitable[Any]]
"""A stream class's reading of the next item from the reader (or :data:`END`)."""


class SseItems:
    """The iteration both providers' stream classes share (through :class:`SseStream`, whose
    ``__anext__`` and ``close`` delegate here).

    :meth:`next` gives the next item (what the SDK's stream yields) or raises
    ``StopAsyncIteration``; at the end, on an error and on :meth:`aclose` (idempotent) the
    body's iterator and the response are closed before anything else runs. ``watch`` is the
    SDK's stream observer (Anthropic's tracing: ``begin``, ``item``, ``end``), if any.
    """

    __slots__ = ("_finished", "_reader", "_response", "_watch")

    def __init__(self, response: httpx2.Response, watch: Any = None) -> None:
        self._response = response
        self._reader: SseReader | None = None
        self._watch = watch
        self._finished = False

    async def next(self, item_of: ItemOf) -> Any:
        """The next item, read by ``item_of``."""
        if self._finished:
            raise StopAsyncIteration
        reader = self._reader
        watch = self._watch
        if reader is None:
            reader = self._reader = SseReader(self._response)
            if watch is not None:
                watch.begin()
        try:
            item = await item_of(reader)
        except Exception as exc:
            if watch is not None:
                watch.end("failed", exc)
            await self.aclose()
            raise
        except BaseException:
            await self.aclose()
            raise
        if item is END:
            if watch is not None:
                watch.end("read")
            await self.aclose()
            raise StopAsyncIteration
        if watch is not None:
            watch.item(item)
        return item

    async def aclose(self) -> None:
        """Close the body's iterator and the response; safe to call more than once."""
        self._finished = True
        if self._reader is not None:
            await self._reader.aclose()
        await self._response.aclose()


class SseStream(Generic[T]):
    """The part both providers' stream classes share, put first in their bases (before the
    SDK's ``AsyncStream``, whose constructor, attributes and ``async with`` they keep):
    iteration through :class:`SseItems` and a ``close`` that closes the body's iterator and
    the response. A subclass supplies ``_item`` (:data:`ItemOf`) and, where its SDK traces
    streams, ``_watch``.

    Generic only because the SDKs read a stream class's item type from its generic bases
    (``__orig_bases__``) and expect every one of them to be parametrised: subclass
    ``SseStream[object]``."""

    response: httpx2.Response
    _items: SseItems | None = None

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Any:
        items = self._items
        if items is None:
            items = self._items = SseItems(self.response, self._watch())
        return await items.next(self._item)

    def _watch(self) -> Any:
        """The SDK's stream observer of this response (None: it has none)."""
        return None

    async def _item(self, reader: SseReader) -> Any:
        raise NotImplementedError

    async def close(self) -> None:
        """Close the response (and the body's iterator); safe to call more than once."""
        if self._items is not None:
            await self._items.aclose()
        await self.response.aclose()
