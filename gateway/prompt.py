"""The prompt-source seam: where the system prompt comes from.

The persona workspace (:mod:`gateway.persona`) is the real source; tests use fixed ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gateway.messages import ChannelContext
from sessions.records import Prompt


@dataclass(frozen=True, slots=True)
class BuiltPrompt:
    """An assembled prompt and the cause of the last change to its inputs.

    ``cause`` names what last changed the workspace (a tool name such as ``memory_write``, or
    ``file_changed`` for an edit made outside the gateway); the agent loop turns it into the
    prompt entry's reason (``rebuilt:<cause>``) when the fingerprint differs from the last call's.
    """

    prompt: Prompt
    cause: str


class PromptSource(Protocol):
    """Builds the system prompt for a conversation.

    Contract: :meth:`build` is cheap when nothing changed (it caches and only re-reads inputs
    whose files changed), reflects every change made so far, including by a tool a moment ago
    in the same turn, and never raises for a missing optional file.
    """

    async def build(self, context: ChannelContext) -> BuiltPrompt: ...
