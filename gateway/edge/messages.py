"""What flows between channels, the router and the agent loop: frozen records, no I/O."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sessions.names import DEFAULT_TENANT


@dataclass(frozen=True, slots=True)
class ConversationKey:
    """Identifies one conversation: the unit that gets one session and one turn at a time."""

    channel: str
    chat: str
    tenant: str = DEFAULT_TENANT
    thread: str | None = None

    def label(self) -> str:
        """Stable printable form, stored in the session header as ``conversation``."""
        base = f"{self.channel}:{self.chat}"
        return f"{base}:{self.thread}" if self.thread else base


@dataclass(frozen=True, slots=True)
class Sender:
    id: str
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Attachment:
    """A file a person sent, as a channel hands it in: downloaded bytes and what the platform
    claims about them (the core sniffs the real type from the bytes).

    ``kind`` is the platform's word for it (``photo``, ``document``, ``voice``, ``audio``,
    ``video_note``, ``sticker``, ``video``, ``file``). ``problem`` says why the channel did not
    download it (``too-large``, ``download-failed``, ``unsupported``); ``data`` is then empty
    and ``size`` what the platform declared. The core refuses those with a clear notice.

    ``fetch``, when set, downloads the file (returning the attachment with its bytes, or with
    a ``problem``). Channels hand files in this way so that nothing is downloaded before the
    access gate has let the sender through: the intake, behind the gate, calls it.

    ``ref``, when set, says where the channel can fetch the file later (plain data, such as
    Slack's ``url_private_download``): the file is downloaded only *after* the message is
    acknowledged, as its turn starts, by the channel's
    :meth:`~gateway.edge.channel.FetchChannel.fetch_file`. Such a message is owed with its
    attachments as they are (references, never bytes: see :func:`deferred`), so a restart
    after the acknowledgement still has what it needs to fetch them.
    """

    name: str
    media_type: str = "application/octet-stream"
    data: bytes = field(default=b"", repr=False)
    kind: str = "file"
    size: int | None = None
    problem: str | None = None
    fetch: Callable[[], Awaitable[Attachment]] | None = field(default=None, repr=False,
                                                              compare=False)
    ref: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Inbound:
    """One message from a person, as a channel adapter hands it to the router.

    ``platform_id`` identifies the delivery on its platform (Telegram update id, Slack
    team/channel/ts) so duplicates can be dropped before they reach a session.

    ``attachments`` are the files as the channel downloaded them. The core takes them in before
    the message is recorded (:mod:`gateway.media.intake`): the bytes go to the blob store and
    the inbound then carries ``parts`` instead, the content blocks recorded with the text
    (references by hash, notes about files that were refused), and ``notice``, the sentence
    the person is told about refused files. ``text`` may be empty when files came alone.
    Files to fetch after the acknowledgement (:func:`deferred`) are the exception: they stay
    in ``attachments`` while the message is owed, and are taken in as its turn starts.

    ``refusal`` marks a message the channel will not pass on (a kind it cannot read, a text over
    the limit): access control decides on its sender first, as on any message, and only a
    sender it admits is told ``refusal``; nothing is recorded
    (:class:`gateway.access.gate.AccessGate`).
    """

    key: ConversationKey
    sender: Sender
    text: str
    platform_id: str | None = None
    chat_type: str = "private"
    received_at: float = 0.0
    meta: Mapping[str, Any] = field(default_factory=dict)
    attachments: tuple[Attachment, ...] = ()
    parts: tuple[Mapping[str, Any], ...] = ()
    notice: str | None = None
    refusal: str | None = None


SCHEDULED = "scheduled"
"""The ``meta`` key of a scheduled turn's message (:mod:`gateway.schedule.fire`): which
schedule, which occurrence, who set it. The log keeps it with the message."""


def deferred(inbound: Inbound) -> bool:
    """Whether ``inbound`` carries files to fetch after its acknowledgement (an attachment
    with a ``ref``): then it is owed with its attachments as references and taken in
    (downloaded, checked, stored) as its turn starts, not before it is recorded."""
    return any(a.ref is not None for a in inbound.attachments)


@dataclass(frozen=True, slots=True)
class OutboundFile:
    """A file the agent sends to the person (the ``send_file`` tool): already in the blob
    store under ``hash``, handed to the reply sink to deliver."""

    name: str
    media_type: str
    data: bytes = field(repr=False)
    hash: str


def user_message(inbound: Inbound) -> dict[str, Any]:
    """The user message recorded for ``inbound``: its text, or (once it carried files) a block
    list of the attachment references, then the text, then notes about refused files."""
    if not inbound.parts:
        return {"role": "user", "content": inbound.text}
    refs = [dict(p) for p in inbound.parts if p.get("type") == "attachment"]
    notes = [dict(p) for p in inbound.parts if p.get("type") != "attachment"]
    text = [{"type": "text", "text": inbound.text}] if inbound.text.strip() else []
    return {"role": "user", "content": [*refs, *text, *notes]}


def answerable(inbound: Inbound) -> bool:
    """Whether there is anything for the model: text, or at least one accepted attachment.
    (A message whose files were all refused is answered by its notice alone.)"""
    return bool(inbound.text.strip()) or any(p.get("type") == "attachment" for p in inbound.parts)


@dataclass(frozen=True, slots=True)
class ChannelContext:
    """What the prompt and the tools see of the conversation: where the agent is speaking,
    to whom, and so whose memory scope applies (:func:`gateway.edge.scopes.scope_of`).

    ``chat`` is the conversation's chat id (without thread), ``person`` the platform user id of
    whoever wrote the message being answered, ``speaker`` their display name (or id);
    ``thread`` the conversation's thread (a Slack thread, a Telegram topic), if any.
    ``scheduled_by`` is who set the schedule when the message being answered is a scheduled
    turn's trigger (its ``created_by``: ``person:CHANNEL:ID``, ``operator``, ...; see
    :data:`SCHEDULED`): nobody wrote it then, whatever ``person`` says.
    """

    channel: str
    chat_type: str
    speaker: str | None
    tenant: str = DEFAULT_TENANT
    chat: str = ""
    person: str = ""
    thread: str | None = None
    scheduled_by: str | None = None
