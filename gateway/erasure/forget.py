"""``/forget``: a person erases, from a direct message, what the gateway keeps about them.

``/forget`` alone says what would be erased and asks for ``/forget confirm``; the confirmation
then does what ``gateway forget --user CHANNEL:ID`` does for the operator, through the same
service (:mod:`gateway.erasure.service`: their channel held still in every worker, their
memory scope, their one-to-one sessions, their messages in groups replaced by markers, a
tombstone). The conversation the command is served in is exempt from the wait: it is this
turn. In a group it erases nothing and says to write in private. The confirmation needs no
state between the two messages, so it works the same when several workers serve the chat.
"""

from __future__ import annotations

from gateway.edge.commands import CommandCall
from gateway.edge.erasure import ErasureRefusedError
from gateway.edge.scopes import ONE_TO_ONE, scope_of
from gateway.erasure.service import ErasureService

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
BUSY_REPLY = (
    "I could not erase anything just now: our conversations were busy. Nothing was changed; "
    "please send /forget confirm again in a moment."
)
DONE_REPLY = (
    "Done: I erased what I remembered about you ({memory}) and {sessions}. "
    "We start from scratch."
)


class ForgetCommand:
    """The handler of ``/forget`` (:data:`gateway.edge.commands.FORGET`; see the module
    docstring)."""

    def __init__(self, service: ErasureService) -> None:
        self.service = service

    async def run(self, call: CommandCall) -> str:
        if call.context.chat_type != ONE_TO_ONE:
            return GROUP_REPLY
        scope = scope_of(call.context)
        if call.args.lower() not in CONFIRM_WORDS:
            found = await self.service.eraser.sessions_of(scope)
            return ASK_REPLY.format(sessions=_count(len(found), "saved conversation"))
        try:
            report = await self.service.erase(scope, requested_by="self",
                                              exempt=call.inbound.key)
        except ErasureRefusedError:
            return BUSY_REPLY
        counts = report.counts()
        return DONE_REPLY.format(memory=_count(counts.get("memory", 0), "file"),
                                 sessions=_count(counts.get("session", 0), "conversation"))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
