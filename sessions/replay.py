"""Offline replay: rebuild every provider call of a session log. Pure: bytes in, objects out.

A *call* is one provider request (a *turn*, which answers one inbound message, makes one or
more). In format v3 each ``call`` entry opens a call and the assistant message after it closes
it (a call that failed has no assistant message). In v1/v2, as in the seed project, each
assistant message closes a call, its prompt is the nearest preceding prompt
entry, and the messages sent are all earlier messages.

Honesty rules: calls before the first prompt entry keep a null prompt (never back-filled); a v1
log says its prompt was not recorded; a v2/v3 log with calls but no prompt entry says prompt
persistence likely failed. A torn last line (one with no newline after it: a write that was
interrupted) is tolerated; a corrupt complete line, the last one included, becomes a
:class:`Problem` with its line number. An empty file or a bad header raises
:class:`~sessions.errors.SessionReadError` (the only error replay raises for bad input).

Cost is O(file size): message entries are kept as byte offsets into the log and parsed when
asked for, and calls carry window bounds, never copies of the transcript.

The parts live beside this entry, one idea each: :mod:`sessions.replay_builder` (the state of
one pass, a handler per entry type), :mod:`sessions.replay_judge` (whether each call can be
rebuilt) and :mod:`sessions.replay_fields` (the parsers of single fields). This module reads the
bytes: the header, the lines, the torn tail, and hands each entry to the builder.
"""

from __future__ import annotations

import gc
from typing import Any

import orjson

from sessions.encoding import ESCAPED, unescape
from sessions.errors import (
    CorruptHeaderError,
    EmptySessionError,
)
from sessions.replay_builder import Builder
from sessions.replay_model import (
    ERASED,
    NOT_REBUILDABLE,
    NOT_RECORDED,
    NOTICE_BEFORE_FIRST,
    NOTICE_CALL_UNRECORDED,
    NOTICE_NO_PROMPTS,
    NOTICE_PROMPT_MISSING,
    NOTICE_V1,
    REBUILT,
    Call,
    Delivered,
    Gap,
    MessageLog,
    NotRebuildableError,
    Outcome,
    Problem,
    PromptVersion,
    Refused,
    Replay,
    Replied,
    RerunOf,
    SectionRef,
    Status,
)

__all__ = [  # the model's names stay importable from here, where callers always found them
    "ERASED",
    "NOTICE_BEFORE_FIRST",
    "NOTICE_CALL_UNRECORDED",
    "NOTICE_NO_PROMPTS",
    "NOTICE_PROMPT_MISSING",
    "NOTICE_V1",
    "NOT_REBUILDABLE",
    "NOT_RECORDED",
    "REBUILT",
    "Call",
    "Delivered",
    "Gap",
    "MessageLog",
    "NotRebuildableError",
    "Outcome",
    "Problem",
    "PromptVersion",
    "Refused",
    "Replay",
    "Replied",
    "RerunOf",
    "SectionRef",
    "Status",
    "replay_bytes",
]

# -- parsing -----------------------------------------------------------------------------------


def _parse_header(data: bytes, end: int) -> tuple[dict[str, Any], int]:
    try:
        head = orjson.loads(memoryview(data)[:end])
    except orjson.JSONDecodeError as exc:
        raise CorruptHeaderError("header is not valid JSON", line=1) from exc
    if not isinstance(head, dict) or head.get("type") != "session":
        raise CorruptHeaderError("line 1 is not a session header", line=1)
    version = head.get("version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CorruptHeaderError(f"header has an invalid version {version!r}", line=1)
    return head, version


def replay_bytes(data: bytes) -> Replay:
    """Replay a whole session log given as bytes."""
    # Replay allocates only acyclic containers (dicts, lists, tuples from orjson and our
    # records), which reference counting frees on its own; the cyclic collector would only
    # re-traverse the survivors (calls, prompt versions) again and again, costing 5-10 % on
    # large logs. It is paused for this synchronous call only and restored after, whatever
    # state it was in.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _replay(data)
    finally:
        if was_enabled:
            gc.enable()


def _replay(data: bytes) -> Replay:
    if not data.strip():
        raise EmptySessionError("session file is empty")
    first_end = data.find(b"\n")
    if first_end == -1:
        # A header with no newline after it was torn mid-write: there is nothing to replay.
        raise EmptySessionError("session holds only a torn header line")
    header, version = _parse_header(data, first_end)
    builder = Builder(data, version)
    view = memoryview(data)
    loads = orjson.loads
    pos = first_end + 1
    line = 1
    size = len(data)
    torn = False
    v3 = version >= 3
    if v3:
        builder.check_seq(header, 1)
    while pos < size:
        line += 1
        end = data.find(b"\n", pos)
        if end == -1:
            torn = True  # the last line was never finished: skip it, as the format allows
            break
        try:
            entry = loads(view[pos:end])
        except orjson.JSONDecodeError:
            # Torn means unterminated (handled above): a newline-terminated line that does not
            # parse was written whole and is corrupt, wherever it is, the last line included.
            if end > pos:
                builder.damage(line, "not valid JSON")
            pos = end + 1
            continue
        if not isinstance(entry, dict):
            builder.damage(line, "not a JSON object")
            pos = end + 1
            continue
        if ESCAPED in entry:  # an entry the fast encoder could not take exactly
            entry = unescape(entry)
        if v3:
            # Fast path for the common case (the next seq); anything else is judged and
            # reported by check_seq.
            seq = entry.get("seq")
            if type(seq) is int and seq - 1 == builder.last_seq:
                builder.last_seq = seq
            else:
                builder.check_seq(entry, line)
        kind = entry.get("type")
        if kind == "message":
            builder.on_message(entry, line, pos, end)
        elif kind == "call":
            builder.on_call(entry, line)
        elif kind == "outcome":
            builder.on_outcome(entry, line)
        elif kind == "section":
            builder.on_section(entry, line)
        elif kind == "prompt":
            builder.on_prompt(entry, line)
        elif kind == "tools":
            builder.on_tools(entry, line)
        elif kind == "gap":
            builder.on_gap(entry, line)
        elif kind == "refusal":
            builder.on_refusal(entry, line)
        elif kind == "reply":
            builder.on_reply(entry, line)
        elif kind == "delivery":
            builder.on_delivery(entry, line)
        elif kind == "session":
            builder.problem(line, "a second session header")
        # any other type (reflection, model_change, future types) is skipped on purpose
        pos = end + 1
    return builder.finish(header, torn)
