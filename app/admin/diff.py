"""Section-aware diff of two prompt versions. Pure: replay objects in, records out.

Sections are paired by name (the n-th section of a name with the n-th of the same name in the
other version). The result follows the newer version's order, with removed sections placed
after the section that preceded them in the older version. Each pair is ``unchanged``,
``added``, ``removed`` or ``changed``; a changed section carries a line diff with a few lines
of context around each change (long unchanged runs are cut into ``skip`` lines).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sessions.replay import PromptVersion, SectionRef

Status = Literal["unchanged", "added", "removed", "changed"]
LineKind = Literal["same", "add", "del", "skip"]
CONTEXT_LINES = 3

_Key = tuple[str, int]


@dataclass(frozen=True, slots=True)
class DiffLine:
    """One line of a section diff; ``skip`` lines stand for ``count`` unchanged lines."""

    kind: LineKind
    text: str
    count: int = 1


@dataclass(frozen=True, slots=True)
class SectionDiff:
    """How one named section differs between two versions.

    ``available`` is False when a text needed for the line diff is not in the log (a section
    entry was lost); the status then comes from the section hashes alone.
    """

    name: str
    status: Status
    lines: tuple[DiffLine, ...]
    available: bool = True

    @property
    def added(self) -> int:
        return sum(1 for line in self.lines if line.kind == "add")

    @property
    def removed(self) -> int:
        return sum(1 for line in self.lines if line.kind == "del")


def _keyed(sections: Sequence[SectionRef]) -> dict[_Key, SectionRef]:
    seen: dict[str, int] = {}
    out: dict[_Key, SectionRef] = {}
    for ref in sections:
        n = seen.get(ref.name, 0)
        seen[ref.name] = n + 1
        out[(ref.name, n)] = ref
    return out


def line_diff(old: str, new: str, context: int = CONTEXT_LINES) -> tuple[DiffLine, ...]:
    """Lines of ``old`` -> ``new``: changes with ``context`` unchanged lines around them."""
    a, b = old.splitlines(), new.splitlines()
    out: list[DiffLine] = []
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    opcodes = matcher.get_opcodes()
    for n, (op, i1, i2, j1, j2) in enumerate(opcodes):
        if op == "equal":
            same = a[i1:i2]
            # context only on the sides where a change is next to this run
            head = 0 if n == 0 else context
            tail = 0 if n == len(opcodes) - 1 else context
            if len(same) > head + tail + 1:
                out.extend(DiffLine("same", t) for t in same[:head])
                out.append(DiffLine("skip", "", len(same) - head - tail))
                out.extend(DiffLine("same", t) for t in same[len(same) - tail:])
            else:
                out.extend(DiffLine("same", t) for t in same)
            continue
        out.extend(DiffLine("del", t) for t in a[i1:i2])
        out.extend(DiffLine("add", t) for t in b[j1:j2])
    return tuple(out)


def _whole(text: str | None, kind: LineKind) -> tuple[DiffLine, ...]:
    return tuple(DiffLine(kind, t) for t in (text or "").splitlines())


def _pair(name: str, old: SectionRef | None, new: SectionRef | None) -> SectionDiff:
    if old is None:
        assert new is not None
        return SectionDiff(name, "added", _whole(new.text, "add"), new.text is not None)
    if new is None:
        return SectionDiff(name, "removed", _whole(old.text, "del"), old.text is not None)
    if old.hash == new.hash:
        return SectionDiff(name, "unchanged", (), True)
    if old.text is None or new.text is None:
        return SectionDiff(name, "changed", (), False)
    return SectionDiff(name, "changed", line_diff(old.text, new.text))


def diff_versions(old: PromptVersion, new: PromptVersion) -> list[SectionDiff]:
    """Per-section differences from ``old`` to ``new`` (see the module docstring)."""
    a, b = _keyed(old.sections), _keyed(new.sections)
    removed_after: dict[_Key | None, list[_Key]] = {}
    anchor: _Key | None = None
    for key in a:
        if key in b:
            anchor = key
        else:
            removed_after.setdefault(anchor, []).append(key)
    order: list[_Key] = list(removed_after.get(None, []))
    for key in b:
        order.append(key)
        order.extend(removed_after.get(key, []))
    return [_pair(key[0], a.get(key), b.get(key)) for key in order]
