"""Judging a rebuilt call: whether its request can be rebuilt from the log (and if not, what is
missing), the note for a call sent with an old prompt-cache split, and a session-wide notice.

Separate from the builder because it answers another question at another time: the builder
records what each line says; judging runs once, in :meth:`~sessions.replay_builder.Builder.finish`,
over the finished drafts, and decides which requests a reader can trust. It reads the builder's
state and never changes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sessions.records import Window
from sessions.replay_model import (
    ERASED,
    NOT_REBUILDABLE,
    NOT_RECORDED,
    NOTICE_BEFORE_FIRST,
    REBUILT,
    Call,
    PromptVersion,
    Status,
)

if TYPE_CHECKING:  # only for the annotation: the builder calls the judge, not the reverse
    from sessions.replay_builder import Builder


def judge_call(builder: Builder, d: dict[str, Any],
               version: PromptVersion | None) -> tuple[Status, str | None]:
    """Whether a call's request can be rebuilt from the log, and if not, what is missing."""
    if builder.version < 3:
        return NOT_RECORDED, f"format v{builder.version} predates call recording"
    if builder.damaged is not None and builder.damaged < d["line"]:
        return NOT_REBUILDABLE, (f"damaged or missing entries before it, from line "
                                 f"{builder.damaged}")
    if d["window"] is None:
        return NOT_REBUILDABLE, "its message window is malformed"
    if builder.erased and (gone := _erased_in(builder.erased, d["window"])) is not None:
        return ERASED, gone
    if version is None:
        return NOT_REBUILDABLE, f"missing prompt entry {d['prompt_fp'] or '(none named)'}"
    if version.text is None:
        missing = [ref.hash for ref in version.sections if ref.text is None]
        return NOT_REBUILDABLE, f"missing section {', '.join(missing) or '(malformed)'}"
    if not version.verified:
        return NOT_REBUILDABLE, f"prompt {version.fingerprint} does not match its text"
    tools = d["tools_fingerprint"]
    if tools is not None and tools not in builder.tool_sets:
        return NOT_REBUILDABLE, f"missing tool set {tools}"
    cache = d["cache"]
    if cache is not None and cache.system > len(version.sections):
        return NOT_REBUILDABLE, (f"its prompt-cache plan cuts after section {cache.system} of "
                                 f"{len(version.sections)}")
    return REBUILT, None


def glued_note(version: PromptVersion, cut: int) -> str:
    """What a call recorded with an old cache plan (no ``joined``) sent: its two system blocks
    without the joiner between them, so two sections ran together."""
    before, after = version.sections[cut - 1].name, version.sections[cut].name
    return (f"sent with an older prompt-cache split: its system blocks left out the blank line "
            f"between sections {cut} ({before}) and {cut + 1} ({after}), so the model read them "
            f"run together; the system prompt shown is the one it read, and the request is "
            f"rebuilt as it was sent")


def _erased_in(erased: Mapping[int, str | None], window: Window) -> str | None:
    """Why a call whose window holds an erased message cannot be rebuilt (``None``: none)."""
    found = sorted(i for i in erased for start, end in window if start <= i < end)
    if not found:
        return None
    when = sorted({at for i in found if (at := erased[i])})
    on = f" on {when[-1]}" if when else ""
    return (f"{len(found)} message(s) it sent were erased{on}; the log keeps a marker in "
            "their place")


def with_notice(call: Call, notice: str) -> Call:
    """A session-wide notice replaces the generic per-call one, not a more specific one."""
    if call.prompt is not None or call.prompt_notice not in (None, NOTICE_BEFORE_FIRST):
        return call
    return replace(call, prompt_notice=notice)
