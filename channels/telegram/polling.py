"""Long polling in our own event loop: ``getUpdates`` with a watchdog, backoff and health.

One task runs the cycle: ``getUpdates(offset, timeout=TELEGRAM_POLL_TIMEOUT)``, then every
update through ``handle`` (which records it via ``deliver``), and only then is ``offset``
moved past it, so Telegram drops an update only once the gateway has recorded it (Telegram
confirms everything below ``offset`` when the next ``getUpdates`` arrives). A batch's updates
of one chat are handled one after another, in order; different chats' side by side. (Each
recording waits for the disk; handled one at a time, a busy bot's batch of twenty chats waited
twenty times in a row, and so did the next poll.) The offset then moves past the longest run
of handled updates from the batch's start. When the router refuses an update because the
gateway is stopping (it stops taking input before the channels close), polling ends there,
leaving that update and the rest to the next start. When it cannot be recorded (the store or
Redis is down), the offset is held: polling pauses (backoff up to :data:`MAX_BACKOFF`) and asks
again from that update, so nothing is confirmed unrecorded. Later updates of other chats that
were recorded meanwhile come again with it and are known as repeats (the router's duplicate
check), so none is answered twice.

Failures:

* stall: a cycle that does not complete within ``TELEGRAM_STALL_SECONDS`` is cancelled and
  reissued at once (counted in ``stalls``); PTB's own read timeout is set past the watchdog;
* 409 Conflict (another poller, or a webhook is set): retried with exponential backoff, capped
  at 30 s, counted in ``conflicts`` and shown in health. The webhook is never deleted for you:
  that is the operator's decision (``deleteWebhook``, or ``TELEGRAM_MODE=webhook``);
* 429: waits ``retry_after``; network errors, a rejected token and anything else: backoff.

Health is ``ok`` while the last cycle succeeded; the counters and ``last_error`` (a short
kind, never a message) stay after recovery.
"""

from __future__ import annotations

import asyncio
import datetime as dtm
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from telegram import Update
from telegram.error import Conflict, RetryAfter

from channels.telegram.sink import BotApi, error_kind, retry_after_seconds
from gateway.edge.channel import RouterClosedError
from gateway.edge.errors import Failure, UnavailableError

log = logging.getLogger(__name__)

ALLOWED_UPDATES: Final = ("message",)
"""Only messages: edits, reactions and member updates are never asked for."""
MAX_BACKOFF: Final = 30.0

Handle = Callable[[Update], Awaitable[None]]


class Poller:
    """The polling task. :meth:`start` once; :meth:`stop` is idempotent."""

    def __init__(self, api: BotApi, handle: Handle, *, poll_timeout: int,
                 stall_seconds: float, backoff: float = 0.5,
                 on_poll: Callable[[], None] | None = None) -> None:
        """``on_poll`` is called as each getUpdates request is built: the polling rhythm as
        an observer sees it (its order against the turns a batch started is a promise of
        :meth:`_run`, which the tests check through this, not by wrapping a method)."""
        self.api = api
        self.on_poll = on_poll
        self.handle = handle
        self.poll_timeout = poll_timeout
        self.stall_seconds = stall_seconds
        self.backoff = backoff
        self.offset: int | None = None
        self.conflicts = 0
        self.stalls = 0
        self.last_ok: dtm.datetime | None = None
        self.last_error: str | None = None
        self._failing: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._handling = 0  # updates being handled now

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="telegram-poll")
        self._task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._fail(Failure.CRASHED)
            log.error("telegram polling stopped (%s)",
                      self.api.describe(task.exception() or RuntimeError()))

    def health(self) -> dict[str, Any]:
        running = self._task is not None and not self._task.done()
        ok = running and self._failing is None
        return {
            "ok": ok,
            "last_poll_ok": self.last_ok.isoformat(timespec="seconds") if self.last_ok else None,
            "conflicts": self.conflicts,
            "stalls": self.stalls,
            # Never a null reason while unhealthy: a poller that is not running says so.
            "last_error": self.last_error or (None if ok else "not polling"),
        }

    async def stop(self, grace: float = 5.0) -> None:
        """Stop polling: a poll or a backoff is cancelled at once; an update being handled
        gets ``grace`` seconds to be recorded (not lost half-way), then it is cancelled too."""
        self._stopping = True
        task = self._task
        if task is None or task.done():
            return
        if self._handling:
            await asyncio.wait([task], timeout=grace)
        task.cancel()
        await asyncio.wait([task])  # waits for the cancel without swallowing our own

    def _fail(self, kind: str) -> None:
        self._failing = kind
        self.last_error = kind

    async def _run(self) -> None:
        delay = hold = self.backoff
        while not self._stopping:
            try:
                updates = await self._fetch()
            except TimeoutError:  # the watchdog: this cycle hung
                self.stalls += 1
                self._fail(Failure.STALL)
                self.api.metrics.channel_errors.labels(channel="telegram", kind=Failure.STALL).inc()
                log.warning("telegram: getUpdates stalled for %.0f s; polling again",
                            self.stall_seconds)
                continue
            except RetryAfter as exc:
                self._fail(Failure.RATE_LIMITED)
                self.api.failed("getUpdates", exc)
                await asyncio.sleep(retry_after_seconds(exc))
                continue
            except Exception as exc:  # every failure is retried; see the module docstring
                if isinstance(exc, Conflict):
                    self.conflicts += 1
                self._fail(error_kind(exc))
                self.api.failed("getUpdates", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_BACKOFF)
                continue
            delay = self.backoff
            self._failing = None
            self.last_ok = dtm.datetime.now(dtm.UTC)
            handled_of = await self._handle_batch(updates)
            for update in updates:
                # Not tried: stopping, or behind its chat's earlier update that failed (the
                # loop has stopped at that one already).
                handled = handled_of.get(update.update_id)
                if handled is None:
                    return
                if not handled:  # not recorded: hold the offset, ask again after a pause
                    await asyncio.sleep(hold)
                    hold = min(hold * 2, MAX_BACKOFF)
                    break
                hold = self.backoff
                self.offset = update.update_id + 1
            if updates:
                # Let the turns just started take their first step (up to their provider
                # request) before the next getUpdates is built: a person's answer is what
                # waits, while the next poll only acknowledges what is already recorded.
                await asyncio.sleep(0)

    async def _fetch(self) -> tuple[Update, ...]:
        if self.on_poll is not None:
            self.on_poll()
        async with asyncio.timeout(self.stall_seconds):
            return await self.api.bot.get_updates(
                offset=self.offset, timeout=self.poll_timeout,
                allowed_updates=list(ALLOWED_UPDATES),
                # PTB adds the poll timeout to this; the watchdog must fire first.
                read_timeout=self.stall_seconds,
            )

    async def _handle_batch(self, updates: Sequence[Update]) -> dict[int, bool | None]:
        """Handle a batch: each chat's updates in order, different chats side by side. Returns
        what :meth:`_handle` said of each update it tried; a chat's updates after one that was
        not handled are not tried (its order must hold), nor is anything once stopping."""
        by_chat: dict[int | None, list[Update]] = {}
        for update in updates:
            chat = update.effective_chat
            by_chat.setdefault(chat.id if chat is not None else None, []).append(update)
        handled_of: dict[int, bool | None] = {}

        async def in_order(chat_updates: Sequence[Update]) -> None:
            for update in chat_updates:
                if self._stopping:
                    return
                handled = handled_of[update.update_id] = await self._handle(update)
                if not handled:
                    return

        if len(by_chat) == 1:
            await in_order(updates)  # the usual case: no task per chat
        else:
            await asyncio.gather(*(in_order(chat_updates) for chat_updates in by_chat.values()))
        return handled_of

    async def _handle(self, update: Update) -> bool | None:
        """True once handled; False when it could not be recorded (its offset is held);
        None when the gateway is stopping (not confirmed, polling ends)."""
        self._handling += 1
        try:
            await self.handle(update)
        except RouterClosedError:
            self._stopping = True
            log.info("telegram: stopping; update %d is left to the next start", update.update_id)
            return None
        except UnavailableError:
            self._fail(Failure.UNAVAILABLE)  # logged once per episode by the router
            return False
        except Exception as exc:  # one bad update must not wedge the poll: log, count, move on
            self.api.metrics.channel_errors.labels(channel="telegram", kind=Failure.DELIVER).inc()
            log.error("telegram: update %d could not be delivered (%s)", update.update_id,
                      self.api.describe(exc))
        finally:
            self._handling -= 1
        return True

