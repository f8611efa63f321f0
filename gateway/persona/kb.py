"""Knowledge-base notes: parsing, the bounded index in the prompt, search, file names.

A note is ``# <title>`` on its first line, then the text (notes without a heading take the file
stem as title). Notes come from the operator layer, the tenant layer and the conversation's
memory scope; the prompt carries one line per note, newest first, cut to the index limit, and
the model reads notes through ``kb_search``. Pure, except :func:`kb_file_name` (reads the
candidates it may replace; called in a worker thread).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.persona.files import read
from sessions.fingerprint import fingerprint

KB_HEADER = "## Knowledge base (use kb_search to read a note)\n"
KB_LINE_PREVIEW = 100


@dataclass(frozen=True, slots=True)
class Note:
    """One note as the index and search see it; ``key`` is unique across layers."""

    mtime: int
    key: str
    text: str


def parse_note(key: str, text: str) -> tuple[str, str]:
    """``(title, body)`` of a kb note: the ``# `` heading if any, else the file stem."""
    stem = Path(key).stem
    stripped = text.strip()
    first, _, rest = stripped.partition("\n")
    if first.startswith("# "):
        return first[2:].strip() or stem, rest.strip()
    return stem, stripped


def kb_index(notes: Sequence[Note], limit: int) -> str:
    """One line per note, newest first, at most ``limit`` characters after the header,
    ending with ``(+N more notes)`` when cut; ``""`` without notes."""
    if not notes:
        return ""
    ordered = sorted(notes, key=lambda n: (-n.mtime, n.key))
    reserve = len(f"\n(+{len(ordered)} more notes)")
    lines: list[str] = []
    used = 0
    for note in ordered:
        title, body = parse_note(note.key, note.text)
        line = f"- {cut(title, 80)}"
        first = next((ln.strip() for ln in body.splitlines() if ln.strip()), "")
        if first:
            line += f": {cut(' '.join(first.split()), KB_LINE_PREVIEW)}"
        cost = len(line) + (1 if lines else 0)
        remaining = len(ordered) - len(lines) - 1
        if used + cost + (reserve if remaining else 0) > limit:
            break
        lines.append(line)
        used += cost
    more = len(ordered) - len(lines)
    if more:
        lines.append(f"(+{more} more notes)")
    return KB_HEADER + "\n".join(lines)


def search(
    notes: Sequence[Note], terms: Sequence[str], limit: int, snippet_chars: int
) -> list[tuple[str, str]]:
    """Notes matching ``terms`` as ``(title, snippet)``, best first (title hits count 3x)."""
    scored: list[tuple[int, int, str, str, str]] = []
    for note in notes:
        title, body = parse_note(note.key, note.text)
        low_title, low_body = title.lower(), body.lower()
        score = sum(3 * low_title.count(t) + low_body.count(t) for t in terms)
        if score:
            scored.append((score, note.mtime, title, body, low_body))
    scored.sort(key=lambda s: (-s[0], -s[1], s[2]))
    hits: list[tuple[str, str]] = []
    for _, _, title, body, low_body in scored[: max(limit, 0)]:
        hits.append((title, _snippet(body, low_body, terms, snippet_chars)))
    return hits


def query_terms(query: str, max_terms: int) -> list[str]:
    return list(dict.fromkeys(re.findall(r"\w+", query.lower())))[:max_terms]


def kb_file_name(kb_dir: Path, title: str) -> str:
    """The file for the note titled ``title``: a slug of it (``[a-z0-9-]`` only, so no
    traversal), or the slug plus a short hash when another title already has the slug."""
    slug = _slugify(title)
    candidates = (f"{slug}.md", f"{slug}-{fingerprint(title)[:8]}.md")
    for candidate in candidates:
        try:
            existing = parse_note(candidate, read(kb_dir / candidate)[1])[0]
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


def _snippet(body: str, low_body: str, terms: Sequence[str], size: int) -> str:
    if len(body) <= size:
        return body
    positions = [p for p in (low_body.find(t) for t in terms) if p >= 0]
    start = max(min(positions, default=0) - size // 4, 0)
    text = body[start : start + size]
    return ("…" if start else "") + text + ("…" if start + size < len(body) else "")


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
