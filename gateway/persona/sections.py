"""The system prompt's sections, assembled from layer texts (pure: no I/O).

Sections always come in :data:`SECTION_ORDER`; the operator's and the tenant's first (they
change least, which keeps provider-side prompt caches warm), the conversation's memory scope
after them::

    soul     operator  SOUL.md                       text as is
    user     operator  USER.md                       who the agent serves, as the operator says
    notes    operator  MEMORY.md                     the operator's notes (older gateways let the
                                                     model write this file: see the migration)
    skills   operator  skills/*.md                   one skill per file, by file name
    tenant   tenant    tenants/<t>/TENANT.md         about this tenant (Slack workspace...)
    memory   scope     MEMORY.md                     what memory_write saved in this scope
    mood     scope     MOOD.md (else the operator's) one short line
    kb       all three kb/*.md                       a bounded index of the notes
    channel  context   where the conversation happens, and who speaks

A missing or blank file gives an empty section, which :meth:`Prompt.from_sections` drops.
"""

from __future__ import annotations

from gateway.edge.messages import ChannelContext
from gateway.edge.scopes import ONE_TO_ONE, Scope
from gateway.persona.kb import cut
from sessions.records import Section

SECTION_ORDER = ("soul", "user", "notes", "skills", "tenant", "memory", "mood", "kb", "channel")
OPERATOR_SECTIONS = frozenset({"soul", "user", "notes", "skills"})
"""The operator layer's sections (soul_patch with self-editing aside, only the operator writes
them): leading the prompt, they are its stable prefix, which a provider may cache across every
conversation (:attr:`gateway.agent.prompt.BuiltPrompt.stable`)."""

USER_HEADER = "## About the people you serve (from the operator)\n"
NOTES_HEADER = "## Notes from the operator\n"
SKILLS_HEADER = "## Skills\n"
TENANT_HEADER = "## About this workspace (from the operator)\n"
PERSON_MEMORY_HEADER = "## What you remember about this person (memory_write adds to it)\n"
CHAT_MEMORY_HEADER = (
    "## What you remember about this chat (everyone in it sees what you say; "
    "memory_write adds to it)\n"
)
MOOD_HEADER = "## How you feel right now\n"
CHANNEL_HEADER = "## Where you are\n"
SHARED_CHAT_NOTE = "each message starts with [name (id)] of the person who wrote it"


def headed(header: str, text: str) -> str:
    return header + text if text else ""


def skills_section(skills: list[tuple[str, str]]) -> Section:
    """``skills`` as ``(name, text)`` pairs, in the order given."""
    body = "\n\n".join(f"### {name}\n{text}" for name, text in skills if text)
    return Section("skills", headed(SKILLS_HEADER, body))


def memory_section(scope: Scope, text: str) -> Section:
    header = PERSON_MEMORY_HEADER if scope.kind == "person" else CHAT_MEMORY_HEADER
    return Section("memory", headed(header, text))


def mood_section(text: str) -> Section:
    return Section("mood", headed(MOOD_HEADER, " ".join(text.split())))


def channel_section(context: ChannelContext) -> Section:
    """``## Where you are`` from the channel context; names are squashed to one short line
    because they come from the platform, not from us. In a shared chat the speaker changes
    from message to message, so it is named in each message instead (the prompt stays put)."""
    parts = [f"Channel: {one_line(context.channel)}", f"chat: {one_line(context.chat_type)}"]
    if context.chat_type != ONE_TO_ONE:
        parts.append(SHARED_CHAT_NOTE)
    elif context.speaker:
        parts.append(f"speaking with: {one_line(context.speaker)}")
    return Section("channel", CHANNEL_HEADER + " · ".join(parts))


def one_line(value: str, limit: int = 80) -> str:
    return cut(" ".join(value.split()), limit)
