"""The persona workspace: the agent's system prompt, assembled from files it can edit itself.

Layout under the workspace root (directories ``0700``, files ``0600``)::

    SOUL.md          who the agent is                 -> section "soul"   (text as is)
    USER.md          what it knows about the user     -> section "user"
    MEMORY.md        its working memory               -> section "memory"
    skills/*.md      one skill per file, by file name -> section "skills"
    MOOD.md          one short line: the current mood -> section "mood"
    kb/*.md          knowledge-base notes             -> section "kb" (a bounded index only)
    (ChannelContext) where the conversation happens   -> section "channel"

Sections always come in that order: ``soul, user, memory, skills, mood, kb, channel``
(:data:`SECTION_ORDER`). A missing or blank file gives an empty section, which
:meth:`Prompt.from_sections` drops. File texts are used with surrounding whitespace stripped
(so a trailing newline does not leak into the joiner). The mood lives in plain-text ``MOOD.md``
rather than JSON so an operator can edit it without being able to break it.

A kb note is ``# <title>`` on its first line, then the text (notes without a heading take the
file stem as title). The prompt carries one line per note, newest first, cut to
``kb_index_limit`` characters; the model reads notes through ``kb_search``.

Hot reload: every :meth:`PersonaWorkspace.build` scans the three directories (one
``os.scandir`` each plus one ``lstat`` per tracked file) and compares each file's
``(mtime_ns, size, inode)`` stamp with the one it last read or wrote. Only changed files are
re-read (in a worker thread); when nothing changed, the very same :class:`Prompt` object is
returned for the same :class:`ChannelContext`. A change the workspace made itself (a tool)
records the tool's name as the cause; any other difference found on disk records
``file_changed``. Limitation: an in-place edit that keeps size and inode within the file
system's timestamp granularity is invisible until the next edit. Symlinks are ignored: what is
in these files goes to a third-party provider, so the workspace reads only regular files it
can see in its own directories.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import stat
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeAlias

from gateway.errors import ToolError
from gateway.messages import ChannelContext
from gateway.prompt import BuiltPrompt, stable_prefix
from sessions.fingerprint import fingerprint
from sessions.records import Prompt, Section

log = logging.getLogger(__name__)

Stamp: TypeAlias = tuple[int, int, int]
"""``(st_mtime_ns, st_size, st_ino)`` of a file: what tells a change without reading it."""

SECTION_ORDER = ("soul", "user", "memory", "skills", "mood", "kb", "channel")
OPERATOR_SECTIONS = frozenset({"soul", "user", "skills"})
"""Sections only the operator writes (soul_patch aside): when they lead the prompt, they are
its stable prefix, cached by the provider across conversations (:attr:`BuiltPrompt.stable`)."""

SOUL, USER, MEMORY, MOOD = "SOUL.md", "USER.md", "MEMORY.md", "MOOD.md"
ROOT_FILES = frozenset({SOUL, USER, MEMORY, MOOD})
SKILLS_DIR, KB_DIR = "skills", "kb"

USER_HEADER = "## What you know about the user (USER.md)\n"
MEMORY_HEADER = "## Your working memory (MEMORY.md)\n"
SKILLS_HEADER = "## Skills\n"
MOOD_HEADER = "## How you feel right now\n"
KB_HEADER = "## Knowledge base (use kb_search to read a note)\n"
CHANNEL_HEADER = "## Where you are\n"

MAX_READ_BYTES = 1 << 20
"""Files are read up to this many bytes: an operator's stray huge file cannot eat the heap."""
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
KB_LINE_PREVIEW = 100

CAUSE_INITIAL = "initial"
CAUSE_FILE_CHANGED = "file_changed"


class PersonaWorkspace:
    """A directory of persona files, served as a :class:`~gateway.prompt.PromptSource`.

    Mutators (used by :mod:`gateway.persona_tools`) write atomically, update the cache and
    record their ``cause``; they raise :class:`ToolError` for a bad or oversized request.
    A missing or empty root is seeded with a short default persona on first use.
    """

    def __init__(self, root: Path, *, kb_index_limit: int = 2000, name: str = "Lisa") -> None:
        if kb_index_limit < MIN_KB_INDEX_LIMIT:
            raise ValueError(f"kb_index_limit must be at least {MIN_KB_INDEX_LIMIT}")
        if not name.strip() or len(name) > 100 or "\n" in name:
            raise ValueError("name must be one non-empty line of at most 100 characters")
        self.root = Path(root)
        self.kb_index_limit = kb_index_limit
        self.name = name.strip()
        self._lock = asyncio.Lock()
        self._ready = False
        self._stamps: dict[str, Stamp] = {}
        self._texts: dict[str, str] = {}
        self._cause = CAUSE_INITIAL
        self._base: tuple[Section, ...] | None = None
        self._prompts: dict[ChannelContext, Prompt] = {}

    # -- PromptSource -----------------------------------------------------------------------

    async def build(self, context: ChannelContext) -> BuiltPrompt:
        """The prompt for ``context``, reflecting every change so far; cached while unchanged."""
        await self._sync()
        prompt = self._prompts.get(context)
        if prompt is None:
            if self._base is None:
                self._base = self._base_sections()
            prompt = Prompt.from_sections([*self._base, channel_section(context)])
            if len(self._prompts) >= MAX_CACHED_CONTEXTS:
                self._prompts.clear()
            self._prompts[context] = prompt
        return BuiltPrompt(prompt=prompt, cause=self._cause,
                           stable=stable_prefix(prompt.sections, OPERATOR_SECTIONS))

    @property
    def cause(self) -> str:
        """What last changed the workspace: a tool name, ``file_changed`` or ``initial``."""
        return self._cause

    # -- mutators ---------------------------------------------------------------------------

    async def append_memory(self, text: str, *, cause: str = "memory_write") -> None:
        """Append ``text`` as a new paragraph of MEMORY.md."""
        entry = _bounded(text, "memory entry", MAX_MEMORY_ENTRY)

        def plan() -> tuple[str, str]:
            current = _read_text(self.root / MEMORY).strip()
            new = f"{current}\n\n{entry}\n" if current else f"{entry}\n"
            if len(new) > MAX_MEMORY_CHARS:
                raise ToolError(
                    f"MEMORY.md would exceed {MAX_MEMORY_CHARS} characters; "
                    "summarise or move old entries to the knowledge base first"
                )
            return MEMORY, new

        await self._mutate(plan, cause)

    async def patch_soul(self, find: str, replace: str, *, cause: str = "soul_patch") -> None:
        """Replace the one exact occurrence of ``find`` in SOUL.md with ``replace``.

        An empty ``find`` appends ``replace`` as a new paragraph. Not found or found more than
        once is a :class:`ToolError` (the model should quote more context).
        """
        for value, what in ((find, "find"), (replace, "replace")):
            if len(value) > MAX_PATCH_CHARS:
                raise ToolError(f"{what} is longer than {MAX_PATCH_CHARS} characters")
        if not find and not replace.strip():
            raise ToolError("nothing to do: find and replace are both empty")

        def plan() -> tuple[str, str]:
            current = _read_text(self.root / SOUL)
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

        await self._mutate(plan, cause)

    async def write_kb(self, title: str, text: str, *, cause: str = "kb_write") -> str:
        """Create or replace the note titled ``title``; returns its path relative to the root.

        The file name is a slug of the title (``[a-z0-9-]`` only, so no traversal); a
        different title with the same slug gets the slug plus a short hash of the title.
        """
        clean_title = " ".join(_bounded(title, "title", MAX_KB_TITLE).split())
        body = _bounded(text, "note", MAX_KB_NOTE)
        kb_dir = self.root / KB_DIR

        def plan() -> tuple[str, str]:
            return f"{KB_DIR}/{_kb_file_name(kb_dir, clean_title)}", f"# {clean_title}\n\n{body}\n"

        return await self._mutate(plan, cause)

    async def search_kb(
        self, query: str, limit: int = 5, *, snippet_chars: int = 300
    ) -> list[tuple[str, str]]:
        """Notes matching the words of ``query`` (case-insensitive), best first.

        Each hit is ``(title, snippet)``; a title match counts three times a body match.
        """
        if len(query) > MAX_QUERY:
            raise ToolError(f"query is longer than {MAX_QUERY} characters")
        terms = list(dict.fromkeys(re.findall(r"\w+", query.lower())))[:MAX_QUERY_TERMS]
        if not terms:
            raise ToolError("query has no words to search for")
        await self._sync()
        notes = [
            (self._stamps[key][0], key, text)
            for key, text in self._texts.items()
            if key.startswith(f"{KB_DIR}/")
        ]
        # Scoring scans up to megabytes of text: keep it off the event loop.
        return await asyncio.to_thread(_search, notes, terms, limit, snippet_chars)

    async def set_mood(self, mood: str, *, cause: str = "mood_set") -> None:
        """Set the one-line current mood (at most 100 characters)."""
        line = " ".join(_bounded(mood, "mood", MAX_MOOD).split())

        def plan() -> tuple[str, str]:
            return MOOD, f"{line}\n"

        await self._mutate(plan, cause)

    # -- cache and disk ---------------------------------------------------------------------

    async def _mutate(self, plan: Callable[[], tuple[str, str]], cause: str) -> str:
        await self._open()
        async with self._lock:
            try:
                key, stamp, text = await asyncio.to_thread(self._apply, plan)
            except OSError as exc:
                raise ToolError(f"could not save: {exc.strerror or type(exc).__name__}") from exc
            self._stamps[key] = stamp
            self._texts[key] = text
            self._cause = cause
            self._invalidate()
        return key

    def _apply(self, plan: Callable[[], tuple[str, str]]) -> tuple[str, Stamp, str]:
        """Worker thread: compute the new text from what is on disk now, then write it."""
        key, text = plan()
        return key, atomic_write(self.root / key, text), text

    async def _open(self) -> None:
        if self._ready:
            return
        async with self._lock:
            if self._ready:
                return
            await asyncio.to_thread(seed_if_empty, self.root, self.name)
            current = self._scan()
            self._load(current, await asyncio.to_thread(_read_files, self.root, list(current)))
            self._ready = True

    async def _sync(self) -> None:
        """Bring the cache up to date with the disk; cheap (stats only) when nothing changed."""
        await self._open()
        if self._scan() == self._stamps:
            return
        async with self._lock:
            # A tool write may have finished while we waited: only what still differs counts.
            current = self._scan()
            if current == self._stamps:
                return
            changed = [k for k, st in current.items() if self._stamps.get(k) != st]
            self._load(current, await asyncio.to_thread(_read_files, self.root, changed))
            self._cause = CAUSE_FILE_CHANGED
            self._invalidate()

    def _load(self, current: Mapping[str, Stamp], read: Mapping[str, tuple[Stamp, str]]) -> None:
        for key in [k for k in self._stamps if k not in current]:
            del self._stamps[key]
            self._texts.pop(key, None)
        for key, (stamp, text) in read.items():
            # An unreadable file keeps its scan stamp with empty text, so it is not re-read
            # on every build; a later edit changes the stamp and retries.
            self._stamps[key] = stamp if stamp != _NO_STAMP else current[key]
            self._texts[key] = text

    def _scan(self) -> dict[str, Stamp]:
        """Stamp every tracked file.

        Runs on the event loop on purpose: three ``scandir`` calls and one ``lstat`` per file
        cost a few microseconds per file on a local disk (about 1 ms with 200 kb notes),
        cheaper than a hop to a worker thread for the usual handful of files, and this is
        what lets every build see every change.
        """
        stamps: dict[str, Stamp] = {}
        for directory, prefix in (
            (self.root, ""),
            (self.root / SKILLS_DIR, f"{SKILLS_DIR}/"),
            (self.root / KB_DIR, f"{KB_DIR}/"),
        ):
            try:
                with os.scandir(directory) as entries:
                    for entry in entries:
                        name = entry.name
                        if prefix:
                            if not name.endswith(".md") or name.startswith("."):
                                continue
                        elif name not in ROOT_FILES:
                            continue
                        try:
                            st = entry.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        if stat.S_ISREG(st.st_mode):
                            stamps[prefix + name] = (st.st_mtime_ns, st.st_size, st.st_ino)
            except (FileNotFoundError, NotADirectoryError):
                continue
        return stamps

    def _invalidate(self) -> None:
        self._base = None
        self._prompts.clear()

    # -- assembly ---------------------------------------------------------------------------

    def _text(self, key: str) -> str:
        return self._texts.get(key, "").strip()

    def _base_sections(self) -> tuple[Section, ...]:
        """Every section but the channel one, from the cached texts (no I/O)."""
        skills = [
            f"### {key[len(SKILLS_DIR) + 1 : -3]}\n{self._text(key)}"
            for key in sorted(k for k in self._texts if k.startswith(f"{SKILLS_DIR}/"))
            if self._text(key)
        ]
        mood = " ".join(self._text(MOOD).split())
        return (
            Section("soul", self._text(SOUL)),
            Section("user", _headed(USER_HEADER, self._text(USER))),
            Section("memory", _headed(MEMORY_HEADER, self._text(MEMORY))),
            Section("skills", _headed(SKILLS_HEADER, "\n\n".join(skills))),
            Section("mood", _headed(MOOD_HEADER, mood)),
            Section("kb", self._kb_index()),
        )

    def _kb_index(self) -> str:
        """One line per note, newest first, at most ``kb_index_limit`` characters after the
        header, ending with ``(+N more notes)`` when cut."""
        keys = [k for k in self._texts if k.startswith(f"{KB_DIR}/")]
        if not keys:
            return ""
        keys.sort(key=lambda k: (-self._stamps[k][0], k))
        reserve = len(f"\n(+{len(keys)} more notes)")
        lines: list[str] = []
        used = 0
        for key in keys:
            title, body = parse_note(key, self._texts[key])
            line = f"- {_cut(title, 80)}"
            first = next((ln.strip() for ln in body.splitlines() if ln.strip()), "")
            if first:
                line += f": {_cut(' '.join(first.split()), KB_LINE_PREVIEW)}"
            cost = len(line) + (1 if lines else 0)
            remaining = len(keys) - len(lines) - 1
            if used + cost + (reserve if remaining else 0) > self.kb_index_limit:
                break
            lines.append(line)
            used += cost
        more = len(keys) - len(lines)
        if more:
            lines.append(f"(+{more} more notes)")
        return KB_HEADER + "\n".join(lines)


def channel_section(context: ChannelContext) -> Section:
    """``## Where you are`` from the channel context; names are squashed to one short line
    because they come from the platform, not from us."""
    parts = [f"Channel: {_one_line(context.channel)}", f"chat: {_one_line(context.chat_type)}"]
    if context.speaker:
        parts.append(f"speaking with: {_one_line(context.speaker)}")
    return Section("channel", CHANNEL_HEADER + " · ".join(parts))


def parse_note(key: str, text: str) -> tuple[str, str]:
    """``(title, body)`` of a kb note: the ``# `` heading if any, else the file stem."""
    stem = Path(key).stem
    stripped = text.strip()
    first, _, rest = stripped.partition("\n")
    if first.startswith("# "):
        return first[2:].strip() or stem, rest.strip()
    return stem, stripped


# -- files (called in worker threads) ---------------------------------------------------------

_NO_STAMP: Stamp = (-1, -1, -1)


def atomic_write(path: Path, text: str) -> Stamp:
    """Write ``text`` to ``path`` atomically with mode 0600; returns the new file's stamp."""
    ensure_dir(path.parent)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(text.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself must survive a crash
    finally:
        os.close(dir_fd)
    st = os.lstat(path)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def ensure_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) with mode 0700 if it does not exist."""
    if not path.is_dir():
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask


def seed_if_empty(root: Path, name: str) -> bool:
    """Seed a missing or empty ``root`` with the default persona; True if it did."""
    if root.exists() and any(root.iterdir()):
        return False
    ensure_dir(root)
    os.chmod(root, 0o700)
    for rel, text in default_files(name).items():
        atomic_write(root / rel, text)
    return True


def default_files(name: str) -> dict[str, str]:
    """The seed persona, by path relative to the root."""
    return {
        SOUL: (
            f"You are {name}, a warm, concise assistant who talks to people over chat.\n"
            "You answer in short, plain sentences and ask when something is unclear.\n"
            "You remember what matters with memory_write, keep lasting notes with kb_write,\n"
            "and you never make up facts.\n"
        ),
        USER: "",
        MEMORY: "",
        f"{SKILLS_DIR}/short-answers.md": (
            "When a reply would run past a few sentences, lead with the answer in one line,\n"
            "then offer the details instead of sending them all at once.\n"
        ),
        MOOD: "calm\n",
        f"{KB_DIR}/welcome.md": (
            "# Welcome\n\nThis is your knowledge base. Save lasting notes with kb_write and "
            "find them again with kb_search.\n"
        ),
    }


def _read_text(path: Path) -> str:
    """A file's text, or ``""`` when it does not exist."""
    try:
        return _read(path)[1]
    except FileNotFoundError:
        return ""


def _read(path: Path) -> tuple[Stamp, str]:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        # Stamp before reading: if the file changes mid-read, the next scan sees a newer
        # stamp than ours and reads it again.
        st = os.fstat(f.fileno())
        data = f.read(MAX_READ_BYTES)
    return (st.st_mtime_ns, st.st_size, st.st_ino), data.decode("utf-8", errors="replace")


def _read_files(root: Path, keys: Sequence[str]) -> dict[str, tuple[Stamp, str]]:
    out: dict[str, tuple[Stamp, str]] = {}
    for key in keys:
        try:
            out[key] = _read(root / key)
        except OSError as exc:
            log.warning("persona file %s unreadable: %s", key, exc.strerror or type(exc).__name__)
            out[key] = (_NO_STAMP, "")
    return out


def _kb_file_name(kb_dir: Path, title: str) -> str:
    slug = _slugify(title)
    candidates = (f"{slug}.md", f"{slug}-{fingerprint(title)[:8]}.md")
    for candidate in candidates:
        try:
            existing = parse_note(candidate, _read(kb_dir / candidate)[1])[0]
        except FileNotFoundError:
            return candidate
        except OSError:
            continue  # a symlink or unreadable file: never write through it, try the next name
        if existing == title:
            return candidate
    return candidates[1]


def _slugify(title: str) -> str:
    ascii_title = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_title.lower()).strip("-")[:60].strip("-")
    return slug or "note"


def _search(
    notes: Sequence[tuple[int, str, str]], terms: Sequence[str], limit: int, snippet_chars: int
) -> list[tuple[str, str]]:
    scored: list[tuple[int, int, str, str, str]] = []
    for mtime, key, text in notes:
        title, body = parse_note(key, text)
        low_title, low_body = title.lower(), body.lower()
        score = sum(3 * low_title.count(t) + low_body.count(t) for t in terms)
        if score:
            scored.append((score, mtime, title, body, low_body))
    scored.sort(key=lambda s: (-s[0], -s[1], s[2]))
    hits: list[tuple[str, str]] = []
    for _, _, title, body, low_body in scored[: max(limit, 0)]:
        hits.append((title, _snippet(body, low_body, terms, snippet_chars)))
    return hits


def _snippet(body: str, low_body: str, terms: Sequence[str], size: int) -> str:
    if len(body) <= size:
        return body
    positions = [p for p in (low_body.find(t) for t in terms) if p >= 0]
    start = max(min(positions, default=0) - size // 4, 0)
    text = body[start : start + size]
    return ("…" if start else "") + text + ("…" if start + size < len(body) else "")


# -- small helpers ------------------------------------------------------------------------------


def _bounded(value: str, what: str, limit: int) -> str:
    stripped = value.strip()
    if not stripped:
        raise ToolError(f"{what} is empty")
    if len(stripped) > limit:
        raise ToolError(f"{what} is longer than {limit} characters ({len(stripped)})")
    return stripped


def _headed(header: str, text: str) -> str:
    return header + text if text else ""


def _one_line(value: str, limit: int = 80) -> str:
    return _cut(" ".join(value.split()), limit)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
