"""The persona workspace: the system prompt, assembled from layers with explicit owners.

Layout under the workspace root (directories ``0700``, files ``0600``)::

    SOUL.md, USER.md, MEMORY.md, MOOD.md,   the operator layer: written by the operator only
      skills/*.md, kb/*.md                  (the model's soul_patch only with self-editing on)
    tenants/<tenant>/TENANT.md, kb/*.md     a tenant layer (optional): the operator's, one tenant
    memory/<tenant>/<channel>/people/<id>/  a person's memory scope (one-to-one conversations)
    memory/<tenant>/<channel>/chats/<id>/   a chat's memory scope (groups, channels, threads)
        MEMORY.md, MOOD.md, kb/*.md           what the model's tools write, and scope.json
                                              (the scope's tenant, channel, kind and raw id)

Which conversation has which scope, and how ids become safe directory names:
:mod:`gateway.edge.scopes`. Which sections a prompt has: :mod:`gateway.persona.sections`. A
prompt holds the operator layer, its tenant's layer and its own scope, nothing else; tools
write only to the scope of the conversation they run in.

When nothing changed, :meth:`PersonaWorkspace.build` returns the very same :class:`Prompt`
object for the same :class:`ChannelContext` (hot reload: :mod:`gateway.persona.layer`).

**Migration.** Gateways before scopes let the model write the root ``USER.md``, ``MEMORY.md``,
``MOOD.md`` and ``kb/`` for everyone. Those files stay where they are, byte for byte, and are
now operator text (read-only to the model, still in every prompt): nothing is lost, and the
operator decides what to keep. The first start on such a workspace logs that once and writes
the ``.layout`` marker, which new workspaces get when they are seeded.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

from gateway.agent.prompt import BuiltPrompt, stable_prefix
from gateway.edge.errors import ToolError
from gateway.edge.messages import ChannelContext
from gateway.edge.scopes import Scope, scope_of, segment
from gateway.persona.files import atomic_write, ensure_dir, read_text
from gateway.persona.kb import KB_HEADER, kb_file_name, kb_index, query_terms, search
from gateway.persona.layer import CAUSE_INITIAL, Layer, new_counter
from gateway.persona.memory_scopes import SCOPE_FILE, delete_scope, scope_dir
from gateway.persona.sections import (
    NOTES_HEADER,
    OPERATOR_SECTIONS,
    SECTION_ORDER,
    TENANT_HEADER,
    USER_HEADER,
    channel_section,
    headed,
    memory_section,
    mood_section,
    skills_section,
)
from sessions.records import Prompt, Section

log = logging.getLogger(__name__)

__all__ = ["KB_HEADER", "OPERATOR_SECTIONS", "SECTION_ORDER", "PersonaWorkspace",
           "channel_section"]

SOUL, USER, MEMORY, MOOD, TENANT = "SOUL.md", "USER.md", "MEMORY.md", "MOOD.md", "TENANT.md"
SKILLS_DIR, KB_DIR = "skills", "kb"
TENANTS_DIR = "tenants"
LAYOUT_FILE, LAYOUT = ".layout", "scopes-1\n"
OPERATOR_FILES = frozenset({SOUL, USER, MEMORY, MOOD})

MAX_MEMORY_ENTRY = 2_000
MAX_MEMORY_CHARS = 50_000
MAX_SOUL_CHARS = 20_000
MAX_PATCH_CHARS = 5_000
MAX_KB_TITLE = 200
MAX_KB_NOTE = 20_000
MAX_MOOD = 100
MAX_QUERY = 500
MAX_QUERY_TERMS = 20
MIN_KB_INDEX_LIMIT = 100
MAX_CACHED_CONTEXTS = 256
MAX_CACHED_LAYERS = 1024
"""Tenant and scope layers kept in memory; the least recently used beyond are dropped (they
are only caches: the files stay, and are read again when their conversation speaks)."""

SELF_EDIT_OFF = (
    "SOUL.md is the operator's text and self-editing is off (GATEWAY_PERSONA_SELF_EDIT); "
    "keep what you learned with memory_write instead"
)


@dataclass(frozen=True, slots=True)
class _Cached:
    """A built prompt, with the layers it came from and their generations at the time."""

    layers: tuple[Layer, Layer, Layer]
    generations: tuple[int, ...]
    prompt: Prompt
    cause: str
    stable: int


class PersonaWorkspace:
    """The persona's layers, served as a :class:`~gateway.agent.prompt.PromptSource`.

    Mutators (used by :mod:`gateway.persona.tools`) write atomically into one scope (or, with
    ``self_edit``, the operator's SOUL.md), update the cache and record their ``cause``; they
    raise :class:`ToolError` for a refused, bad or oversized request. A missing or empty root
    is seeded with a short default persona on first use.
    """

    def __init__(self, root: Path, *, kb_index_limit: int = 2000, name: str = "Lisa",
                 self_edit: bool = False, rescan_after: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if kb_index_limit < MIN_KB_INDEX_LIMIT:
            raise ValueError(f"kb_index_limit must be at least {MIN_KB_INDEX_LIMIT}")
        if not name.strip() or len(name) > 100 or "\n" in name:
            raise ValueError("name must be one non-empty line of at most 100 characters")
        self.root = Path(root)
        self.kb_index_limit = kb_index_limit
        self.name = name.strip()
        self.self_edit = self_edit
        self._counter = new_counter()
        # The operator's and tenants' files are edited by hand: scanned at most once in
        # ``rescan_after`` seconds (gateway/persona/layer.py). A person's scope layer is
        # scanned on every build, so an erasure done by another worker is never served from
        # this cache.
        self.rescan_after = rescan_after
        self._clock = clock
        self._operator = Layer(self.root, OPERATOR_FILES, (SKILLS_DIR, KB_DIR), self._counter,
                               rescan_after=rescan_after, clock=clock)
        self._open_lock = asyncio.Lock()
        self._ready = False
        self._layers: OrderedDict[tuple[str, ...], Layer] = OrderedDict()
        # context -> (its layers, their generations when built, prompt, cause)
        self._prompts: dict[ChannelContext, _Cached] = {}

    # -- PromptSource -----------------------------------------------------------------------

    async def build(self, context: ChannelContext) -> BuiltPrompt:
        """The prompt for ``context``: operator, tenant and scope layers, as they are now."""
        await self._open()
        cached = self._prompts.get(context)
        layers = cached.layers if cached is not None else self._layers_of(context)
        for layer in layers:
            await layer.sync()
        generations = tuple(layer.generation for layer in layers)
        if cached is None or cached.generations != generations:
            latest = max(layers, key=lambda layer: layer.changed_at)
            cause = latest.cause if latest.changed_at else CAUSE_INITIAL
            prompt = self._assemble(context, *layers)
            cached = _Cached(layers, generations, prompt, cause,
                             stable_prefix(prompt.sections, OPERATOR_SECTIONS))
            if len(self._prompts) >= MAX_CACHED_CONTEXTS:
                self._prompts.clear()
            self._prompts[context] = cached
        return BuiltPrompt(prompt=cached.prompt, cause=cached.cause, stable=cached.stable)

    def _layers_of(self, context: ChannelContext) -> tuple[Layer, Layer, Layer]:
        return (self._operator, self._tenant_layer(context.tenant),
                self._scope_layer(scope_of(context)))

    async def _synced(self, context: ChannelContext) -> tuple[Layer, Layer, Layer]:
        await self._open()
        layers = self._layers_of(context)
        for layer in layers:
            await layer.sync()
        return layers

    def _assemble(self, context: ChannelContext, operator: Layer, tenant: Layer,
                  scope_layer: Layer) -> Prompt:
        scope = scope_of(context)
        skills = [(key[len(SKILLS_DIR) + 1 : -3], operator.text(key))
                  for key in operator.keys(SKILLS_DIR)]
        notes = [*operator.notes(KB_DIR), *tenant.notes(KB_DIR, "tenant:"),
                 *scope_layer.notes(KB_DIR, "scope:")]
        return Prompt.from_sections([
            Section("soul", operator.text(SOUL)),
            Section("user", headed(USER_HEADER, operator.text(USER))),
            Section("notes", headed(NOTES_HEADER, operator.text(MEMORY))),
            skills_section(skills),
            Section("tenant", headed(TENANT_HEADER, tenant.text(TENANT))),
            memory_section(scope, scope_layer.text(MEMORY)),
            mood_section(scope_layer.text(MOOD) or operator.text(MOOD)),
            Section("kb", kb_index(notes, self.kb_index_limit)),
            channel_section(context),
        ])

    # -- mutators (each writes one scope) ------------------------------------------------

    async def append_memory(self, scope: Scope, text: str, *, cause: str = "memory_write") -> None:
        """Append ``text`` as a new paragraph of the scope's MEMORY.md."""
        entry = bounded(text, "memory entry", MAX_MEMORY_ENTRY)
        layer = await self._writable(scope)

        def plan() -> tuple[str, str]:
            current = read_text(layer.root / MEMORY).strip()
            new = f"{current}\n\n{entry}\n" if current else f"{entry}\n"
            if len(new) > MAX_MEMORY_CHARS:
                raise ToolError(
                    f"your memory here would exceed {MAX_MEMORY_CHARS} characters; "
                    "summarise or move old entries to the knowledge base first"
                )
            return MEMORY, new

        await layer.mutate(plan, cause)

    async def patch_soul(self, find: str, replace: str, *, cause: str = "soul_patch") -> None:
        """Replace the one exact occurrence of ``find`` in the operator's SOUL.md.

        Refused (:class:`ToolError`) unless the operator turned self-editing on: SOUL.md is
        shared by every conversation of every tenant. An empty ``find`` appends ``replace``
        as a new paragraph; not found or found more than once is a :class:`ToolError`.
        """
        if not self.self_edit:
            raise ToolError(SELF_EDIT_OFF)
        for value, what in ((find, "find"), (replace, "replace")):
            if len(value) > MAX_PATCH_CHARS:
                raise ToolError(f"{what} is longer than {MAX_PATCH_CHARS} characters")
        if not find and not replace.strip():
            raise ToolError("nothing to do: find and replace are both empty")
        await self._open()

        def plan() -> tuple[str, str]:
            current = read_text(self.root / SOUL)
            if not find:
                body = current.strip()
                new = f"{body}\n\n{replace.strip()}\n" if body else f"{replace.strip()}\n"
            else:
                count = current.count(find)
                if count == 0:
                    raise ToolError("find text not found in SOUL.md (it must match exactly)")
                if count > 1:
                    raise ToolError(
                        f"find text occurs {count} times in SOUL.md; quote more context"
                    )
                new = current.replace(find, replace, 1)
            if len(new) > MAX_SOUL_CHARS:
                raise ToolError(f"SOUL.md would exceed {MAX_SOUL_CHARS} characters")
            return SOUL, new

        await self._operator.mutate(plan, cause)

    async def write_kb(self, scope: Scope, title: str, text: str, *,
                       cause: str = "kb_write") -> str:
        """Create or replace the scope's note titled ``title``; returns its path relative to
        the scope's directory (``kb/<slug>.md``)."""
        clean_title = " ".join(bounded(title, "title", MAX_KB_TITLE).split())
        body = bounded(text, "note", MAX_KB_NOTE)
        layer = await self._writable(scope)

        def plan() -> tuple[str, str]:
            name = kb_file_name(layer.root / KB_DIR, clean_title)
            return f"{KB_DIR}/{name}", f"# {clean_title}\n\n{body}\n"

        return await layer.mutate(plan, cause)

    async def search_kb(self, context: ChannelContext, query: str, limit: int = 5, *,
                        snippet_chars: int = 300) -> list[tuple[str, str]]:
        """Notes visible to ``context`` (operator, its tenant, its scope) matching the words
        of ``query`` (case-insensitive), best first, as ``(title, snippet)``."""
        if len(query) > MAX_QUERY:
            raise ToolError(f"query is longer than {MAX_QUERY} characters")
        terms = query_terms(query, MAX_QUERY_TERMS)
        if not terms:
            raise ToolError("query has no words to search for")
        operator, tenant, scope = await self._synced(context)
        notes = [*operator.notes(KB_DIR), *tenant.notes(KB_DIR, "tenant:"),
                 *scope.notes(KB_DIR, "scope:")]
        # Scoring scans up to megabytes of text: keep it off the event loop.
        return await asyncio.to_thread(search, notes, terms, limit, snippet_chars)

    async def set_mood(self, scope: Scope, mood: str, *, cause: str = "mood_set") -> None:
        """Set the scope's one-line current mood (at most 100 characters)."""
        line = " ".join(bounded(mood, "mood", MAX_MOOD).split())
        layer = await self._writable(scope)

        def plan() -> tuple[str, str]:
            return MOOD, f"{line}\n"

        await layer.mutate(plan, cause)

    async def forget(self, scope: Scope, *, cause: str = "forget") -> list[str]:
        """Delete the scope's memory (every file of its directory); returns what was removed,
        as paths relative to the workspace root, sorted."""
        await self._open()
        return await self._scope_layer(scope).wipe(lambda _: delete_scope(self.root, scope),
                                                   cause)

    # -- layers -------------------------------------------------------------------------------

    async def _writable(self, scope: Scope) -> Layer:
        await self._open()
        return self._scope_layer(scope)

    def _tenant_layer(self, tenant: str) -> Layer:
        return self._cached(("tenant", tenant), lambda: Layer(
            self.root / TENANTS_DIR / segment(tenant), frozenset({TENANT}), (KB_DIR,),
            self._counter, rescan_after=self.rescan_after, clock=self._clock))

    def _scope_layer(self, scope: Scope) -> Layer:
        def make() -> Layer:
            root = scope_dir(self.root, scope)

            def describe() -> None:
                record = {"tenant": scope.tenant, "channel": scope.channel,
                          "kind": scope.kind, "id": scope.id}
                atomic_write(root / SCOPE_FILE, orjson.dumps(record).decode() + "\n",
                             base=self.root)

            return Layer(root, frozenset({MEMORY, MOOD}), (KB_DIR,), self._counter,
                         base=self.root, on_first_write=describe)

        return self._cached(("scope", scope.tenant, scope.channel, scope.kind, scope.id), make)

    def _cached(self, key: tuple[str, ...], make: Callable[[], Layer]) -> Layer:
        layer = self._layers.get(key)
        if layer is None:
            layer = make()
            if len(self._layers) >= MAX_CACHED_LAYERS:
                while len(self._layers) >= MAX_CACHED_LAYERS:
                    self._layers.popitem(last=False)
                # Cached prompts hold their layers: none may keep one that was just dropped
                # (a tool would write through the new one, and its cause would be lost).
                self._prompts.clear()
            self._layers[key] = layer
        else:
            self._layers.move_to_end(key)
        return layer

    async def _open(self) -> None:
        if self._ready:
            return
        async with self._open_lock:
            if not self._ready:
                await asyncio.to_thread(prepare, self.root, self.name)
                self._ready = True


# -- files (called in worker threads) ---------------------------------------------------------


def prepare(root: Path, name: str) -> None:
    """Seed a missing or empty ``root``, or migrate one laid out before scopes (once)."""
    if not seed_if_empty(root, name) and not (root / LAYOUT_FILE).exists():
        migrate(root)


def seed_if_empty(root: Path, name: str) -> bool:
    """Seed a missing or empty ``root`` with the default persona; True if it did."""
    if root.exists() and any(root.iterdir()):
        return False
    ensure_dir(root)
    os.chmod(root, 0o700)  # an empty directory someone made may be 0755
    for rel, text in default_files(name).items():
        atomic_write(root / rel, text, base=root)
    return True


def migrate(root: Path) -> list[str]:
    """Make a pre-scopes workspace's shared, model-written files operator text; log it once.

    Nothing moves and nothing is rewritten: the files are already where the operator layer
    reads them. What changes is who may write them (the operator only), and the log line says
    which of them held text the model wrote for everyone, so the operator can review it.
    Returns the files named in that line.
    """
    held: list[str] = []
    for rel in (USER, MEMORY, MOOD):
        text = read_text(root / rel).strip()
        if text:
            held.append(f"{rel} ({len(text)} characters)")
    kb = root / KB_DIR
    notes = sorted(p.name for p in kb.glob("*.md")) if kb.is_dir() else []
    if notes:
        held.append(f"kb/ ({len(notes)} note{'' if len(notes) == 1 else 's'})")
    log.warning(
        "persona %s: memory is per person and per chat now; the shared files the model could "
        "write for everyone before (%s) are operator text from here on: read-only to the model "
        "and still in every prompt, so review them. New memories go to "
        "memory/<tenant>/<channel>/ (README: 'Who remembers what').",
        root, ", ".join(held) or "none held text",
    )
    atomic_write(root / LAYOUT_FILE, LAYOUT, base=root)
    return held


def default_files(name: str) -> dict[str, str]:
    """The seed persona, by path relative to the root."""
    return {
        SOUL: (
            f"You are {name}, a warm, concise assistant who talks to people over chat.\n"
            "You answer in short, plain sentences and ask when something is unclear.\n"
            "You remember what matters with memory_write, keep lasting notes with kb_write,\n"
            "and you never make up facts.\n"
        ),
        f"{SKILLS_DIR}/short-answers.md": (
            "When a reply would run past a few sentences, lead with the answer in one line,\n"
            "then offer the details instead of sending them all at once.\n"
        ),
        MOOD: "calm\n",
        f"{KB_DIR}/welcome.md": (
            "# Welcome\n\nThis is your knowledge base. Save lasting notes with kb_write and "
            "find them again with kb_search.\n"
        ),
        LAYOUT_FILE: LAYOUT,
    }


def bounded(value: str, what: str, limit: int) -> str:
    stripped = value.strip()
    if not stripped:
        raise ToolError(f"{what} is empty")
    if len(stripped) > limit:
        raise ToolError(f"{what} is longer than {limit} characters ({len(stripped)})")
    return stripped
