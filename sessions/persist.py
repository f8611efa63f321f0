"""Prompt persistence: write what a provider is about to receive, before the call.

:func:`persist_call` is what the persist step of every provider call runs. It writes only
what the log does not hold yet: the text of each new section (once per session, by hash), a
``prompt`` entry when the prompt's fingerprint differs from the last one, a ``tools`` entry
for a tool set not seen before, and always the small ``call`` entry, all in **one** append, so
a failure leaves none of them behind. Errors surface as
:class:`~sessions.errors.SessionWriteError`; the caller decides whether to log and go on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sessions import entries
from sessions.fingerprint import fingerprint, tools_fingerprint
from sessions.records import CallRequest, Outcome
from sessions.store import SessionWriter


@dataclass(frozen=True, slots=True)
class PersistReport:
    """What one :func:`persist_call` wrote."""

    call: int
    sections_written: int
    prompt_written: bool
    tools_written: bool
    bytes_written: int


_tools_fp_cache: dict[int, tuple[tuple[Any, ...], str]] = {}


def _tools_fp(tools: tuple[Any, ...]) -> str | None:
    if not tools:
        return None
    # Tool sets are rebuilt rarely; cache by identity so an unchanged set is not re-hashed on
    # every call (the hot path of the hook).
    cached = _tools_fp_cache.get(id(tools))
    if cached is not None and cached[0] is tools:
        return cached[1]
    fp = tools_fingerprint(tools)
    if len(_tools_fp_cache) > 256:
        _tools_fp_cache.clear()
    _tools_fp_cache[id(tools)] = (tools, fp)
    return fp


async def persist_call(writer: SessionWriter, request: CallRequest,
                       lead: Sequence[Mapping[str, Any]] = ()) -> PersistReport:
    """Append the entries that make ``request`` rebuildable; return what was written.

    ``lead``: entries that go first in the same append (the ``gap`` entries of earlier refused
    appends, which the next accepted append carries).
    """
    state = writer.state
    batch: list[Mapping[str, Any]] = list(lead)
    prompt = request.prompt
    sections_written = 0
    prompt_written = prompt.fingerprint != state.last_prompt
    if prompt_written:
        refs: list[tuple[str, str]] = []
        seen: set[str] = set()
        for section in prompt.sections:
            h = fingerprint(section.text)
            refs.append((section.name, h))
            if h not in state.sections and h not in seen:
                batch.append(entries.section(h, section.text))
                seen.add(h)
                sections_written += 1
        batch.append(entries.prompt(prompt.fingerprint, request.reason, refs))
    tools_fp = _tools_fp(request.tools)
    tools_written = tools_fp is not None and tools_fp not in state.tool_sets
    if tools_written:
        assert tools_fp is not None
        batch.append(entries.tools(tools_fp, request.tools))
    index = state.call_count
    batch.append(entries.call(index, request, tools_fp))
    written = await writer.append(batch)
    return PersistReport(
        call=index,
        sections_written=sections_written,
        prompt_written=prompt_written,
        tools_written=tools_written,
        bytes_written=written,
    )


async def record_outcome(writer: SessionWriter, outcome: Outcome) -> int:
    """Append the ``outcome`` entry of a finished (or failed) call."""
    return await writer.append([entries.outcome(outcome)])
