"""Platform and client ids that reach names in the core (conversation keys, tenants).

Channels validate ids here before building a :class:`~gateway.edge.messages.ConversationKey`: the
same strict pattern the session store applies to the names it turns into paths and keys, so an
id a channel accepts can never be refused later, in the middle of recording a message.
"""

from __future__ import annotations

from sessions.errors import InvalidNameError
from sessions.names import DEFAULT_TENANT, MAX_NAME_LENGTH, validate_name

__all__ = ["DEFAULT_TENANT", "MAX_NAME_LENGTH", "WEB_TENANT", "InvalidIdError", "valid_id"]

WEB_TENANT = "web"
"""The web chat's own tenant (``GATEWAY_WEB_TENANT``'s default): its people, sessions, memory
and budgets are apart from those of Telegram (``default``) and of every Slack workspace."""


class InvalidIdError(ValueError):
    """An id that cannot name a conversation or tenant; the message is safe to show."""


def valid_id(value: object, what: str) -> str:
    """``value`` if it is a safe name, else :class:`InvalidIdError` saying why."""
    try:
        return validate_name(value, what)
    except InvalidNameError as exc:
        raise InvalidIdError(str(exc)) from exc
