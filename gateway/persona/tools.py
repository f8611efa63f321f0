"""The built-in persona tools: how the model keeps what it learns.

Each tool validates its arguments (unknown keys, missing keys or non-strings are a
:class:`ToolError`), calls one :class:`~gateway.persona.workspace.PersonaWorkspace` mutator, whose
cause
is the tool's name, and answers with a short text. Writes go to the memory scope of the
conversation the tool runs in (:func:`gateway.edge.scopes.scope_of` of the call's context), never
to another person's or chat's; ``soul_patch`` edits the operator's SOUL.md and is refused
unless the operator turned self-editing on. The change is visible to the very next provider
call because :meth:`PersonaWorkspace.build` reflects the cache the mutator updated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.edge.errors import ToolError
from gateway.edge.messages import ChannelContext
from gateway.edge.scopes import scope_of
from gateway.edge.tools import Tool, ToolResult
from gateway.persona.workspace import (
    MAX_KB_NOTE,
    MAX_KB_TITLE,
    MAX_MEMORY_ENTRY,
    MAX_MOOD,
    MAX_PATCH_CHARS,
    MAX_QUERY,
    PersonaWorkspace,
)

SEARCH_LIMIT = 5
SEARCH_SNIPPET = 1_000


def _schema(**properties: tuple[str, int]) -> Mapping[str, Any]:
    """An object schema of required string properties: ``name=(description, max_length)``."""
    return {
        "type": "object",
        "properties": {
            name: {"type": "string", "description": text, "maxLength": limit}
            for name, (text, limit) in properties.items()
        },
        "required": list(properties),
        "additionalProperties": False,
    }


def _strings(args: Mapping[str, Any], schema: Mapping[str, Any]) -> dict[str, str]:
    """The arguments as strings, checked against ``schema``'s keys (models do send junk)."""
    allowed = schema["properties"]
    extra = sorted(str(k) for k in args if k not in allowed)
    if extra:
        raise ToolError(f"unexpected argument(s): {', '.join(extra)}")
    out: dict[str, str] = {}
    for name in schema["required"]:
        if name not in args:
            raise ToolError(f"missing argument: {name}")
        value = args[name]
        if not isinstance(value, str):
            raise ToolError(f"argument {name} must be a string, not {type(value).__name__}")
        out[name] = value
    return out


class _PersonaTool:
    name: str
    description: str
    input_schema: Mapping[str, Any]
    server = "persona"

    @property
    def remote_name(self) -> str:
        return self.name

    def __init__(self, workspace: PersonaWorkspace) -> None:
        self.workspace = workspace

    async def run(self, args: Mapping[str, Any], context: ChannelContext) -> ToolResult:
        return ToolResult(await self.apply(_strings(args, self.input_schema), context))

    async def apply(self, args: dict[str, str], context: ChannelContext) -> str:
        raise NotImplementedError


class MemoryWrite(_PersonaTool):
    name = "memory_write"
    description = (
        "Append one entry to your memory of this conversation's person (in a direct "
        "conversation) or chat (in a group), which is part of your system prompt from the "
        "next step on, here and in later conversations with them; nobody else sees it. Use it "
        "for facts worth keeping: preferences, commitments, ongoing tasks. One self-contained "
        f"entry per call, at most {MAX_MEMORY_ENTRY} characters."
    )
    input_schema = _schema(text=("The entry to remember, self-contained.", MAX_MEMORY_ENTRY))

    async def apply(self, args: dict[str, str], context: ChannelContext) -> str:
        await self.workspace.append_memory(scope_of(context), args["text"], cause=self.name)
        return "saved to memory"


class SoulPatch(_PersonaTool):
    name = "soul_patch"
    description = (
        "Edit your persona (SOUL.md), which every conversation shares, by exact text "
        "replacement: `find` must occur exactly once in SOUL.md and is replaced by `replace` "
        "(which may be empty to delete it). With an empty `find`, `replace` is appended as a "
        "new paragraph. Fails if `find` is not found or occurs more than once (quote more "
        "surrounding text then), and always fails unless the operator allowed self-editing."
    )
    input_schema = _schema(
        find=("Exact text currently in SOUL.md, or empty to append.", MAX_PATCH_CHARS),
        replace=("The text to put in its place (or to append).", MAX_PATCH_CHARS),
    )

    async def apply(self, args: dict[str, str], context: ChannelContext) -> str:
        await self.workspace.patch_soul(args["find"], args["replace"], cause=self.name)
        return "SOUL.md appended" if not args["find"] else "SOUL.md updated"


class KbWrite(_PersonaTool):
    name = "kb_write"
    description = (
        "Save a note in the knowledge base of this conversation's person or chat under a short "
        "title; writing the same title again replaces the note. Your system prompt lists note "
        "titles with their first line; use "
        f"kb_search to read notes. Title at most {MAX_KB_TITLE} characters, text at most "
        f"{MAX_KB_NOTE}."
    )
    input_schema = _schema(
        title=("Short title of the note, one line.", MAX_KB_TITLE),
        text=("The note's content; its first line shows in the index.", MAX_KB_NOTE),
    )

    async def apply(self, args: dict[str, str], context: ChannelContext) -> str:
        path = await self.workspace.write_kb(scope_of(context), args["title"], args["text"],
                                             cause=self.name)
        return f"note saved ({path})"


class KbSearch(_PersonaTool):
    name = "kb_search"
    description = (
        "Search your knowledge base notes by words (case-insensitive; title matches weigh "
        f"more). Returns up to {SEARCH_LIMIT} notes, best first, each with its title and its "
        f"text (an excerpt of {SEARCH_SNIPPET} characters around the first match if longer)."
    )
    input_schema = _schema(query=("Words to look for, e.g. a note title.", MAX_QUERY))

    async def apply(self, args: dict[str, str], context: ChannelContext) -> str:
        hits = await self.workspace.search_kb(
            context, args["query"], SEARCH_LIMIT, snippet_chars=SEARCH_SNIPPET
        )
        if not hits:
            return "no matching notes"
        return "\n\n".join(f"## {title}\n{snippet}" for title, snippet in hits)


class MoodSet(_PersonaTool):
    name = "mood_set"
    description = (
        "Set how you feel right now in this conversation (with this person or chat), shown in "
        "your system prompt from the next step on. "
        f"A few words, one line, at most {MAX_MOOD} characters (e.g. 'curious and upbeat')."
    )
    input_schema = _schema(mood=("Your current mood in a few words.", MAX_MOOD))

    async def apply(self, args: dict[str, str], context: ChannelContext) -> str:
        await self.workspace.set_mood(scope_of(context), args["mood"], cause=self.name)
        return "mood set"


def persona_tools(workspace: PersonaWorkspace) -> list[Tool]:
    """The five persona tools over ``workspace``, in a fixed order."""
    return [
        MemoryWrite(workspace),
        SoulPatch(workspace),
        KbWrite(workspace),
        KbSearch(workspace),
        MoodSet(workspace),
    ]
