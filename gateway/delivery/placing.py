"""Where an item's answer is on the platform: noted in its session log before its text goes in.

A channel sink that can reconcile (:class:`gateway.edge.channel.PlacingSink`) is handed a
:class:`SessionPlacement` as the item's turn starts. Each platform message that will carry
the answer (Telegram's placeholder, Slack's first post, each further chunk) is noted as a
``delivery`` entry of the item's session, and the sink waits until the log holds it before
any text of the answer goes into that message. A restart, or the next holder of the
conversation, reads those entries back (:mod:`gateway.delivery.takeover`) and finishes the
answer by editing the noted messages. What is left is the time between the platform
returning a new message's id and that id being in the log: a kill exactly then leaves one
stray placeholder, and the answer comes in a message of its own. That time is measured
(``gateway_reply_note_seconds``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from gateway.agent.conversation import Conversation
from gateway.edge.channel import Placed, PlacingSink, ReplySink
from gateway.edge.metrics import Metrics
from sessions import entries

log = logging.getLogger(__name__)


class SessionPlacement:
    """The :class:`gateway.edge.channel.Placement` of one item whose message is at ``index``
    of ``conv``'s session; ``known`` as the log had them when the turn started."""

    def __init__(self, conv: Conversation, item: str, index: int, metrics: Metrics, *,
                 known: tuple[Placed, ...] = (), resumed: bool = False) -> None:
        self._conv = conv
        self._item = item
        self._index = index
        self._metrics = metrics
        self._known = known
        self._resumed = resumed

    @property
    def item(self) -> str:
        return self._item

    @property
    def known(self) -> tuple[Placed, ...]:
        return self._known

    @property
    def resumed(self) -> bool:
        return self._resumed

    async def note(self, part: int, ref: Mapping[str, Any], *, wait: bool = True) -> bool:
        """Append the ``delivery`` entry and wait until the log holds it (the recorder's
        isolation: a failure is counted and logged once per episode, never raised); with
        ``wait=False`` only until the log accepted it (see
        :class:`gateway.edge.channel.Placement`)."""
        started = time.perf_counter()
        channel = self._conv.key.channel
        written = await self._conv.recorder.append([entries.delivery(self._index, part, ref)])
        durable = written.accepted and (
            not wait or (await self._conv.recorder.flush()).failure is None)
        self._metrics.reply_note_seconds.labels(channel=channel).observe(
            time.perf_counter() - started)
        if not durable:
            self._metrics.reply_notes_unwritten.labels(channel=channel).inc()
            log.debug("session %s: where an answer went could not be noted",
                      self._conv.session_id)
        return durable


def placed_of(found: tuple[tuple[int, Mapping[str, Any]], ...]) -> tuple[Placed, ...]:
    """The messages a takeover found noted, as the sink reads them."""
    return tuple(Placed(part, dict(ref)) for part, ref in found)


def place(sink: ReplySink, placement: SessionPlacement) -> None:
    """Hand ``placement`` to ``sink`` if it reconciles (a web or console sink does not: its
    answer is not a platform message)."""
    if isinstance(sink, PlacingSink):
        sink.place(placement)
