"""Replies to Slack: one :class:`SlackTarget` per inbound message, streamed by
:class:`channels.streaming.EditStreamer`.

A reply lives in the person's thread (``thread_ts``): the first delta posts a plain-text
preview with ``chat.postMessage``, later deltas edit it with ``chat.update`` (throttled by the
streamer), and the final Markdown is rendered to mrkdwn chunks of at most 3000 characters
(:func:`channels.slack.render.render_chunks`): the first chunk replaces the preview, the others
are posted after it in the thread. A reply abandoned instead (another worker answers) has its
preview deleted with ``chat.delete``.

Reconciled (:class:`gateway.edge.channel.PlacingSink`): every message of an answer carries
the item's id in its message metadata (event type :data:`EVENT_TYPE`, payload ``item`` and
``part``), and its ts is noted in the log right after ``chat.postMessage`` returns. A message
noted by an earlier run is edited (``chat.update``), never posted again; an item taken over
(``resumed``) with no note for a part first looks for its own message in the thread
(``conversations.replies`` with ``include_all_metadata``, from the person's message on) and
edits what it finds. So the window Telegram leaves (a message sent, its id not yet noted) is
closed here as far as the history answers. Reading it needs the ``*:history`` scopes: after
the first search refused for want of them (``missing_scope``) the process answers as Telegram
does (each message a placeholder first, noted, then updated), so a kill at that step leaves a
stray placeholder, never a second complete answer. So does an answer outside a thread (a
scheduled turn's message at the top of a DM or channel), which there is no thread to search
for.

Typing: Slack has no typing indicator for bots outside its assistant threads, so the turn
marks the person's message with an :eyes: reaction instead, removed once the reply is
delivered. Without the ``reactions:write`` scope the reaction is switched off for the process
after the first ``missing_scope`` error.

Errors: a rate limit (HTTP 429) is retried by slack_sdk's ``AsyncRateLimitErrorRetryHandler``
after ``Retry-After``; an error that remains is logged (method and Slack error code only, never
a token or message text) and counted in ``gateway_channel_errors_total{channel="slack"}``,
never raised into the turn.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Coroutine
from typing import Any, Final

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from channels.slack.convert import CHANNEL, META_REPLY_THREAD, META_TS
from channels.slack.render import render_chunks
from gateway.edge.channel import Placement
from gateway.edge.errors import ChannelError, Failure
from gateway.edge.messages import Inbound, OutboundFile
from gateway.edge.metrics import Metrics

log = logging.getLogger(__name__)

TYPING_REACTION: Final = "eyes"
PLACEHOLDER: Final = "…"
"""An answer's first text where its message could not be found again (see the docstring)."""
EVENT_TYPE: Final = "gateway_answer"
"""The metadata event type of our answers' messages (see the module docstring)."""
SEARCH_PAGES: Final = 5
SEARCH_PAGE_SIZE: Final = 200
"""How much of a thread a takeover reads looking for its answer (pages of replies)."""
EMPTY_REPLY: Final = "_(no reply)_"
_ERROR_CODE: Final = re.compile(r"[a-z_]{1,40}")
# Errors that mean "this can never work with this app's setup": stop trying reactions.
_NO_REACTIONS: Final = frozenset({"missing_scope", "not_allowed_token_type", "no_permission"})


class SlackCalls:
    """Web API calls for the channel: errors are logged, counted and turned into ``None``."""

    def __init__(self, client: AsyncWebClient, metrics: Metrics) -> None:
        self.client = client
        self.metrics = metrics
        self.last_error: str | None = None
        self.reactions = True
        self.history = True
        """False once reading a thread was refused for good (the app lacks the scope)."""
        self._behind: set[asyncio.Future[None]] = set()

    def behind(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` (calls that must not hold a turn up) in a task kept referenced until
        it ends."""
        task = asyncio.ensure_future(work)
        self._behind.add(task)
        task.add_done_callback(self._behind.discard)

    async def attempt(self, method: str, call: Awaitable[AsyncSlackResponse], *,
                      quiet: bool = False) -> AsyncSlackResponse | None:
        """Await ``call`` (a client coroutine for ``method``); None if it failed (logged unless
        ``quiet``: the caller reports it itself)."""
        try:
            return await call
        except SlackApiError as exc:
            # A non-JSON error page (a proxy's HTML, a plain-text 400) leaves ``data`` a str.
            data = exc.response.data if exc.response is not None else None
            code = data.get("error") if isinstance(data, dict) else None
            kind = (code if isinstance(code, str) and _ERROR_CODE.fullmatch(code)
                    else Failure.API_ERROR)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            kind = Failure.NETWORK
            log.debug("slack %s: %s", method, type(exc).__name__)
        except SlackClientError as exc:
            kind = Failure.CLIENT
            log.debug("slack %s: %s", method, type(exc).__name__)
        self.record_error(method, kind, quiet=quiet)
        return None

    def record_error(self, method: str, kind: str, *, quiet: bool = False) -> None:
        self.last_error = f"{method}: {kind}"
        self.metrics.channel_errors.labels(channel=CHANNEL, kind=kind).inc()
        if not quiet:
            log.warning("slack %s failed: %s", method, kind)
        if method.startswith("reactions.") and kind in _NO_REACTIONS:
            self.reactions = False
        if method == "conversations.replies" and kind in _NO_REACTIONS:
            if self.history:
                log.warning("slack: this app cannot read its threads (%s; add the "
                            "channels:history, groups:history, im:history and mpim:history "
                            "scopes): answers open as placeholders instead", kind)
            self.history = False


class SlackTarget:
    """An :class:`channels.streaming.EditTarget` for the thread of one inbound message."""

    def __init__(self, calls: SlackCalls, inbound: Inbound, *, chunk_limit: int = 3000) -> None:
        self.calls = calls
        self.channel = inbound.key.chat
        # A message the gateway made itself (a scheduled turn) has no Slack meta: its thread
        # is its conversation's.
        self.thread_ts: str | None = inbound.meta.get(META_REPLY_THREAD) or inbound.key.thread
        self.message_ts: str | None = inbound.meta.get(META_TS)
        self.chunk_limit = chunk_limit
        self._reaction: asyncio.Future[AsyncSlackResponse | None] | None = None  # its add
        self._placement: Placement | None = None
        self._parts: dict[int, str] = {}  # part -> ts noted (or found) for it
        self._searched = True

    def place(self, placement: Placement) -> None:
        """Reconcile with what the log noted and, for a resumed item, with the thread."""
        self._placement = placement
        self._parts = {p.part: ts for p in placement.known
                       if p.ref.get("channel") == self.channel
                       and isinstance(ts := p.ref.get("ts"), str)}
        self._searched = not placement.resumed

    async def typing(self) -> None:
        if self._reaction is not None or self.message_ts is None or not self.calls.reactions:
            return  # once per turn: the streamer renews "typing" every few seconds
        # A task of its own, which the removal waits for: the streamer stops typing (cancels
        # its caller) as the reply is ready, and a request cut off mid-way may still reach
        # Slack, after the removal, leaving :eyes: on the person's message for good.
        adding = self._reaction = asyncio.ensure_future(self.calls.attempt(
            "reactions.add", self.calls.client.reactions_add(
                channel=self.channel, timestamp=self.message_ts, name=TYPING_REACTION)))
        if await asyncio.shield(adding) is None and self._reaction is adding:
            self._reaction = None  # not added: the next renewal tries again

    async def send_preview(self, text: str) -> str | None:
        if self._placement is not None:
            return await self._put(0, escape(text))
        return await self._post(escape(text))

    async def edit_preview(self, ref: str, text: str) -> None:
        await self._update(ref, escape(text))

    async def deliver_final(self, text: str, preview: str | None) -> None:
        chunks = render_chunks(text, self.chunk_limit) or [EMPTY_REPLY]
        if self._placement is not None:
            if preview is not None:
                self._parts.setdefault(0, preview)
            for part, chunk in enumerate(chunks):
                if await self._put(part, chunk) is None:
                    break  # a gap in the middle of a reply reads worse than a cut-off one
            await self._unreact()
            return
        first, rest = chunks[0], chunks[1:]
        delivered = preview is not None and await self._update(preview, first)
        if not delivered:
            delivered = await self._post(first) is not None
        for chunk in rest:
            if not delivered:
                break  # a gap in the middle of a reply reads worse than a cut-off one
            delivered = await self._post(chunk) is not None
        await self._unreact()

    async def retract(self, preview: str | None) -> None:
        """``chat.delete`` the preview of a reply that will not be finished here (another
        worker answers) and take the typing reaction back, so the next holder's own can be
        added and removed; failures are logged once and counted, never raised."""
        if preview is not None:
            await self.calls.attempt("chat.delete", self.calls.client.chat_delete(
                channel=self.channel, ts=preview))
        await self._unreact()

    async def _unreact(self) -> None:
        adding, self._reaction = self._reaction, None
        if adding is None:
            return
        if not adding.done():
            # Still on its way (the reply was ready first): taken back once it is in, without
            # holding the turn's end for it; sent now, it could reach Slack first.
            self.calls.behind(self._unreact_after(adding))
        elif adding.result() is not None:
            await self._remove_reaction()

    async def _unreact_after(self, adding: asyncio.Future[AsyncSlackResponse | None]) -> None:
        if await adding is not None:
            await self._remove_reaction()

    async def _remove_reaction(self) -> None:
        await self.calls.attempt("reactions.remove", self.calls.client.reactions_remove(
            channel=self.channel, timestamp=self.message_ts, name=TYPING_REACTION))

    async def send_file(self, file: OutboundFile) -> None:
        """Upload into the person's thread (files upload v2: get an upload URL, send the bytes,
        complete the upload); ChannelError when Slack refused it."""
        response = await self.calls.attempt("files.upload", self.calls.client.files_upload_v2(
            channel=self.channel, thread_ts=self.thread_ts, file=file.data, filename=file.name,
            title=file.name))
        if response is None:
            raise ChannelError(f"slack refused the file ({self.calls.last_error or 'error'})")

    async def _put(self, part: int, text: str) -> str | None:
        """``text`` into the message of ``part``: the one noted or found for it (edited), or
        a new one, tagged with the item and noted. Its ts; None when it failed."""
        if part not in self._parts:
            await self._search()
        ts = self._parts.get(part)
        if ts is not None:
            if await self._update(ts, text):
                return ts
            if self.calls.last_error != "chat.update: message_not_found":
                return None
            del self._parts[part]  # deleted meanwhile: a new one takes its place
        assert self._placement is not None
        # A message not noted could not be found again without the history scopes, nor
        # outside a thread (a scheduled turn's message in a DM or channel: no thread to
        # search): it opens as a placeholder, so a kill before its note leaves "…", never a
        # second complete answer.
        blind = not self.calls.history or self.thread_ts is None
        ts = await self._post(PLACEHOLDER if blind else text, {
            "event_type": EVENT_TYPE,
            "event_payload": {"item": self._placement.item, "part": part}})
        if ts is None:
            return None
        self._parts[part] = ts
        # A placeholder's note must be in the log before the text goes in; a message posted
        # with its text is tagged with the item, so a resumed turn finds it without the note,
        # and the turn does not wait for the note's write (the next message of the
        # conversation would wait behind it).
        await self._placement.note(part, {"channel": self.channel, "ts": ts}, wait=blind)
        if blind and not await self._update(ts, text):
            return None
        return ts

    async def _search(self) -> None:
        """Once, for a resumed item: its answer's messages already in the thread (posted by
        an earlier run that did not live to note them), by their metadata."""
        if self._searched or self._placement is None:
            return
        self._searched = True
        if self.thread_ts is None:
            return
        item, cursor = self._placement.item, None
        for _ in range(SEARCH_PAGES):
            response = await self.calls.attempt(
                "conversations.replies", self.calls.client.conversations_replies(
                    channel=self.channel, ts=self.thread_ts, oldest=self.message_ts,
                    inclusive=False, include_all_metadata=True, limit=SEARCH_PAGE_SIZE,
                    cursor=cursor))
            if response is None:
                return  # logged; the part is posted (the window stays open this once)
            for message in response.get("messages") or []:
                part = _our_part(message, item)
                if part is not None and isinstance(ts := message.get("ts"), str):
                    self._parts.setdefault(part, ts)
            meta = response.get("response_metadata") or {}
            cursor = meta.get("next_cursor") if isinstance(meta, dict) else None
            if not cursor or not response.get("has_more"):
                return

    async def _post(self, text: str, metadata: dict[str, Any] | None = None) -> str | None:
        response = await self.calls.attempt("chat.postMessage", self.calls.client.chat_postMessage(
            channel=self.channel, thread_ts=self.thread_ts, text=text, metadata=metadata))
        ts = response.get("ts") if response is not None else None
        return ts if isinstance(ts, str) else None

    async def _update(self, ts: str, text: str) -> bool:
        response = await self.calls.attempt("chat.update", self.calls.client.chat_update(
            channel=self.channel, ts=ts, text=text))
        return response is not None


def _our_part(message: object, item: str) -> int | None:
    """The part of ``item``'s answer a history message is, by its metadata (None: not one)."""
    meta = message.get("metadata") if isinstance(message, dict) else None
    if not isinstance(meta, dict) or meta.get("event_type") != EVENT_TYPE:
        return None
    payload = meta.get("event_payload")
    if not isinstance(payload, dict) or payload.get("item") != item:
        return None
    part = payload.get("part")
    return part if type(part) is int and part >= 0 else None


def escape(text: str) -> str:
    """Plain text for a message ``text``: Slack requires ``&``, ``<``, ``>`` escaped, which
    also keeps a preview from pinging ``<!channel>``."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
