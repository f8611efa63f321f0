"""Prompt changes that broke a cached prefix: which call, which section. Pure.

A provider caches a request's prefix (tools, then the system prompt, then the history) and a
later request reads it only while it starts with the very same bytes. So when the prompt or the
tool set of a conversation changes, everything from the first changed part on is input again
at full price (and written to the cache anew): the change *busted* the cache from there.

For each call whose tools or prompt differ from the previous call's (compaction calls, which
summarise the history with a prompt of their own, are left out), :func:`cache_busts` names
the first part that differs, in cache order: ``tools``, else the first section (by position)
whose name or text changed. A change counts only when the previous call had something cached:
it placed cache breakpoints (a recorded plan), or its outcome reports cache reads or writes
(OpenAI caches by itself). ``stable`` says the section lies inside the previous call's stable
prefix, the part cached for every conversation (the operator's sections), where a change is
the most expensive.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sessions.replay import Call, Replay


@dataclass(frozen=True, slots=True)
class CacheBust:
    """One cache-busting change, first sent in call ``call`` (1-based)."""

    call: int
    version: int | None
    """The prompt version the call was sent with."""
    section: str
    """The first changed section's name, or ``tools`` for the tool set."""
    stable: bool
    cached_before: int | None
    """Input tokens the previous call read from or wrote to the cache (None: not recorded)."""
    read_after: int | None
    """Input tokens this call read from the cache (None: not recorded)."""

    @property
    def message(self) -> str:
        where = "tools" if self.section == "tools" else f"section {self.section}"
        return f"cache-busting change in {where}"


def _cached(usage: Mapping[str, Any] | None, *keys: str) -> int | None:
    if usage is None:
        return None
    return sum(v for k in keys if isinstance(v := usage.get(k), int) and v > 0)


def _had_cache(replay: Replay, call: Call) -> bool:
    if call.cache is not None:
        return True
    outcome = replay.outcome_of(call)
    return bool(outcome and _cached(outcome.usage, "cache_read_input_tokens",
                                    "cache_creation_input_tokens"))


def first_change(before: Call, after: Call) -> tuple[str, int] | None:
    """The first part (``tools`` or a section name) and its position that differ between two
    calls' requests, in cache order; None when tools and prompt are the same."""
    if before.tools_fingerprint != after.tools_fingerprint:
        return "tools", -1
    old, new = before.prompt, after.prompt
    if old is None or new is None or old.fingerprint == new.fingerprint:
        return None
    refs_old = [(r.name, r.hash) for r in old.sections]
    refs_new = [(r.name, r.hash) for r in new.sections]
    for position, (a, b) in enumerate(zip(refs_old, refs_new, strict=False)):
        if a != b:
            return b[0], position
    # One is a prefix of the other: the first section added (or removed) is the change.
    position = min(len(refs_old), len(refs_new))
    longer = refs_new if len(refs_new) > len(refs_old) else refs_old
    return longer[position][0], position


def cache_busts(replay: Replay) -> list[CacheBust]:
    """Every cache-busting change of the session, in call order."""
    found: list[CacheBust] = []
    previous: Call | None = None
    for call in replay.calls:
        if call.prompt is None or call.window is None:
            continue  # not a recorded request: nothing to compare
        if call.lineage is not None and call.lineage.reason == "compaction":
            continue  # a summary's own call: not part of the conversation's cached prefix
        if previous is not None and _had_cache(replay, previous):
            change = first_change(previous, call)
            if change is not None:
                section, position = change
                plan = previous.cache
                before, after = replay.outcome_of(previous), replay.outcome_of(call)
                found.append(CacheBust(
                    call=call.index,
                    version=call.prompt.number,
                    section=section,
                    stable=section == "tools" or (plan is not None and position < plan.system),
                    cached_before=_cached(before.usage if before else None,
                                          "cache_read_input_tokens",
                                          "cache_creation_input_tokens"),
                    read_after=_cached(after.usage if after else None,
                                       "cache_read_input_tokens"),
                ))
        previous = call
    return found
