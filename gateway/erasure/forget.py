"""``/forget``: a person erases, from a direct message, what the gateway keeps about them.

``/forget`` alone says what would be erased and asks for ``/forget confirm``; the confirmation
then does what ``gateway forget --user CHANNEL:ID`` does for the operator (their memory scope,
their one-to-one sessions, a tombstone: :mod:`gateway.erasure.eraser`), after closing their open
conversations so no open session keeps writing. With several workers only the serving
worker's copies are closed here; another worker's cached copy is never carried on, since a
worker reopens a conversation from the store when its session is no longer the latest
(:meth:`gateway.delivery.registry.ConversationRegistry.get`), and a holder whose session is erased
while it holds the conversation drops its copy at its next write or log read. In a group it
erases nothing and says to write in private: a group's log and memory belong to the chat. The
confirmation needs no state between the two messages, so it works the same when several
workers serve the chat.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from gateway.edge.commands import CommandCall
from gateway.edge.scopes import ONE_TO_ONE, Scope, scope_of
from gateway.erasure.eraser import Eraser

CONFIRM_WORDS = frozenset({"confirm", "yes"})

GROUP_REPLY = (
    "/forget works in a direct message with me: write it to me in private and I will erase "
    "what I remember about you and our one-to-one conversations. What a group says belongs "
    "to the group."
)
ASK_REPLY = (
    "This erases, for good, what I remember about you and our one-to-one conversations on "
    "this channel ({sessions}). Group chats are not touched. To go ahead, send: /forget confirm"
)
DONE_REPLY = (
    "Done: I erased what I remembered about you ({memory}) and {sessions}. "
    "We start from scratch."
)


class ForgetCommand:
    """The handler of ``/forget`` (:data:`gateway.edge.commands.FORGET`; see the module docstring).

    ``close`` closes the open conversations whose memory scope is the given one (the
    registry's), so the erased sessions are not written to again.
    """

    def __init__(self, eraser: Eraser, close: Callable[[Scope], Awaitable[int]]) -> None:
        self.eraser = eraser
        self.close = close

    async def run(self, call: CommandCall) -> str:
        if call.context.chat_type != ONE_TO_ONE:
            return GROUP_REPLY
        scope = scope_of(call.context)
        if call.args.lower() not in CONFIRM_WORDS:
            found = await self.eraser.sessions_of(scope)
            return ASK_REPLY.format(sessions=_count(len(found), "saved conversation"))
        await self.close(scope)
        counts = (await self.eraser.erase(scope, requested_by="self")).counts()
        return DONE_REPLY.format(memory=_count(counts.get("memory", 0), "file"),
                                 sessions=_count(counts.get("session", 0), "conversation"))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
