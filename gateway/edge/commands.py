"""The chat commands: one table, served by every channel in its platform's own way.

People type ``/new`` or ``/help`` in a Telegram chat (where the table is also the bot's command
menu, set with ``setMyCommands`` at start, and ``/start`` greets), in the web chat or the
terminal, and as ``/gateway new`` or ``/gateway help`` in Slack (a slash command: Slack keeps
a message starting with ``/`` for itself, so ``/new`` never reaches the bot as text).

The router answers them (:meth:`gateway.delivery.router.Router.deliver`): ``new`` starts a fresh
session once the conversation's queued turns are done; ``help`` and ``start`` answer at once
and record nothing; a command that needs the gateway's services (``forget``: erase the person,
:mod:`gateway.erasure.forget`) runs a :data:`CommandHandler` the composition root gives the router,
after the conversation's queued turns, and answers with its text. A command is never recorded
and never sent to the model. Anything else that starts with ``/`` is an ordinary message.

To add a command, add a row to :data:`COMMANDS` and teach the router what it does (or give it
a handler); the menus and the help text follow from the table.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from gateway.edge.messages import ChannelContext, Inbound

MAX_ARGS = 200
"""Longer argument text is cut: commands take a word or two, never a message."""


@dataclass(frozen=True, slots=True)
class ChatCommand:
    """One command: its name (no slash), one line for menus and help, whether the platform
    menus list it (``start`` is Telegram's first contact, not a menu entry), and whether it
    is for direct messages only (``forget``: menus of group chats leave it out)."""

    name: str
    summary: str
    listed: bool = True
    direct_only: bool = False


NEW = ChatCommand("new", "start a new conversation (the agent forgets this chat's history)")
HELP = ChatCommand("help", "show the commands")
START = ChatCommand("start", "say hello and show the commands", listed=False)
FORGET = ChatCommand("forget", "erase what I remember about you and our direct chats (asks first)",
                     direct_only=True)
USAGE = ChatCommand("usage", "what you and this chat used today (tokens, cost, allowance)")
REMINDERS = ChatCommand("reminders", "this chat's reminders (cancel ID to cancel one; timezone "
                        "ZONE for yours)")

COMMANDS: tuple[ChatCommand, ...] = (NEW, HELP, FORGET, USAGE, REMINDERS, START)
"""Every chat command, in menu order."""

GREETING = "Hi! Write to me as you would to a person, and I will answer."


def listed(commands: Sequence[ChatCommand] = COMMANDS, *,
           direct: bool = True) -> list[ChatCommand]:
    """The commands platform menus show: in a direct chat (``direct``), or in a group."""
    return [c for c in commands if c.listed and (direct or not c.direct_only)]


def parse(text: str, commands: Sequence[ChatCommand] = COMMANDS) -> ChatCommand | None:
    """The command ``text`` invokes (``/new``, ``/new@botname``, ``/help more words``), or
    None when it is an ordinary message."""
    stripped = text.strip()
    if not stripped.startswith("/"):
        return None
    word = stripped.split(maxsplit=1)[0][1:]
    name = word.split("@", 1)[0].lower()  # Telegram groups address commands: /new@mybot
    return next((c for c in commands if c.name == name), None)


def arguments(text: str) -> str:
    """The words after the command (``/forget confirm`` -> ``confirm``), squashed and bounded."""
    words = text.split(maxsplit=1)
    return " ".join(words[1].split())[:MAX_ARGS] if len(words) > 1 else ""


@dataclass(frozen=True, slots=True)
class CommandCall:
    """One command as typed: who typed it where (``context``), and the words after it."""

    inbound: Inbound
    context: ChannelContext
    args: str


CommandHandler = Callable[[CommandCall], Awaitable[str]]
"""Runs a command the router cannot answer alone; returns the text to answer with (shown to
the person who typed it, in the same conversation). Contract: raises nothing for bad
arguments (it answers with what is wrong instead), may take as long as it needs (the
conversation's next messages wait), and is safe to run again if a worker dies mid-command."""


def help_text(commands: Sequence[ChatCommand] = COMMANDS, *, prefix: str = "/") -> str:
    """One line per listed command; ``prefix`` is how the platform spells them
    (``/gateway `` in Slack)."""
    return "Commands:\n" + "\n".join(f"{prefix}{c.name} - {c.summary}" for c in listed(commands))


def answer(command: ChatCommand, *, prefix: str = "/") -> str | None:
    """The immediate answer of a command that needs no conversation state (``help``,
    ``start``); None for one the router must act on (``new``)."""
    if command is HELP:
        return help_text(prefix=prefix)
    if command is START:
        return f"{GREETING}\n\n{help_text(prefix=prefix)}"
    return None
