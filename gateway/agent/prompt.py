"""The prompt-source seam: where the system prompt comes from.

The persona workspace (:mod:`gateway.persona.workspace`) is the real source; tests use fixed ones.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from gateway.edge.messages import ChannelContext
from sessions.records import Prompt, Section


@dataclass(frozen=True, slots=True)
class BuiltPrompt:
    """An assembled prompt and the cause of the last change to its inputs.

    ``cause`` names what last changed the workspace (a tool name such as ``memory_write``, or
    ``file_changed`` for an edit made outside the gateway); the agent loop turns it into the
    prompt entry's reason (``rebuilt:<cause>``) when the fingerprint differs from the last call's.
    """

    prompt: Prompt
    cause: str
    stable: int = 0
    """How many leading sections change least (the operator's layer): the prefix a provider
    may cache for every conversation. Sources order sections from most to least stable."""


def stable_prefix(sections: Sequence[Section], stable: Collection[str]) -> int:
    """The number of leading ``sections`` whose names are in ``stable``."""
    count = 0
    for section in sections:
        if section.name not in stable:
            break
        count += 1
    return count


class PromptSource(Protocol):
    """Builds the system prompt for a conversation.

    Contract: :meth:`build` is cheap when nothing changed (it caches and only re-reads inputs
    whose files changed), reflects every change made so far, including by a tool a moment ago
    in the same turn, and never raises for a missing optional file.
    """

    async def build(self, context: ChannelContext) -> BuiltPrompt: ...
