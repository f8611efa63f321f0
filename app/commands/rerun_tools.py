"""Tool calls in a rerun: answered from the session's recorded results, or run live.

A rerun of call N that asks for tools gets, by default, the results the session recorded for
the same calls of the same round: round 0 is what call N's own answer asked for, round 1 what
the next call of its turn asked for (the call that was sent round 0's results), and so on.
A recorded result is found by its round and tool-use id (the rerun's answer may repeat the
recorded id; a real provider draws new ones, and then the first recorded call of that round
with the same tool and arguments not already used answers it). The arguments are compared as
canonical JSON (keys sorted, so their order never matters): a call whose arguments differ
from the recorded call of that tool in its round is a *mismatch*, reported with both, and
never given that result. Nothing is taken from another round: the same tool asked twice in
a turn gets each round's own result.

With ``--live-tools`` the configured MCP servers run the call again and the rerun shows whether
the new result differs from the recorded one. Persona tools never run in a rerun (they would
edit the persona files). A call with neither a recorded nor a live result (or a mismatch) is
shown, not executed, and the rerun stops there: it never makes up a result the model would
take for real.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.agent.tools import ToolSet
from gateway.edge.messages import ChannelContext
from sessions.records import MessageDict
from sessions.replay import Call, Replay

RECORDED = "recorded"
LIVE = "live"
MISSING = "not executed"
MISMATCH = "not executed: arguments differ"
NOT_RUN = (MISSING, MISMATCH)


def canonical(args: Any) -> str:
    """Tool arguments as canonical JSON: keys sorted at every level, no spaces, non-ASCII
    kept (Python's json: total over what a log holds, integers past 64 bits and NaN too)."""
    return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str)


@dataclass(frozen=True, slots=True)
class RecordedUse:
    """One tool call a recorded answer made, and the result the log holds for it."""

    round: int
    id: str
    name: str
    input: Any
    args: str
    """:func:`canonical` of ``input``."""
    answered: bool
    """Whether the log holds its result."""
    content: Any = None
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class ToolStep:
    """One tool call of a rerun answer and where its result came from."""

    id: str
    name: str
    input: Any
    source: str
    """``recorded``, ``live``, ``not executed`` or ``not executed: arguments differ``."""
    content: Any = None
    """The tool_result content given to the model (None when not executed)."""
    is_error: bool = False
    recorded: Any = None
    """The recorded content for the same call, when there is one."""
    round: int = 0
    """Which round of the rerun asked for it (0: the rerun call's own answer)."""
    matched: RecordedUse | None = field(default=None, compare=False)
    """The recorded call it was matched with (same round, same tool), if any."""

    @property
    def differs(self) -> bool | None:
        """For a live result: whether it differs from the recorded one (None: nothing to
        compare with, or not live)."""
        if self.source != LIVE or self.recorded is None:
            return None
        return bool(self.content != self.recorded)

    def json(self) -> dict[str, Any]:
        body = {"id": self.id, "name": self.name, "input": self.input, "source": self.source,
                "round": self.round, "result": self.content, "isError": self.is_error,
                "recorded": self.recorded, "differs": self.differs}
        if self.matched is not None:
            body["recordedCall"] = {"id": self.matched.id, "input": self.matched.input}
        return body


class RecordedRounds:
    """The tool calls a recorded call's turn made, round by round, with their results."""

    def __init__(self, replay: Replay, call: Call) -> None:
        self.rounds: list[list[RecordedUse]] = []
        current: Call | None = call
        while current is not None and current.assistant is not None:
            uses = _uses(replay.messages[current.assistant], len(self.rounds))
            if not uses:
                break
            results_at = _results(replay, current.assistant, uses)
            self.rounds.append([_answered(use, results_at) for use in uses])
            current = _sent_results(replay, current, results_at)
        self._taken: set[tuple[int, str]] = set()

    def of(self, number: int) -> list[RecordedUse]:
        """Round ``number``'s recorded calls (empty past the rounds the turn had)."""
        return self.rounds[number] if number < len(self.rounds) else []

    def match(self, number: int, use_id: str, name: str,
              args: Any) -> tuple[str, RecordedUse | None]:
        """Which recorded call of round ``number`` answers the rerun's call: ``(RECORDED,
        use)``; ``(MISMATCH, use)`` when the recorded call it pairs with (the same id, or the
        same tool) had other arguments or another tool; ``(MISSING, None)`` when the round
        recorded no call of that tool (or none with its result). Each recorded call answers
        once."""
        key = canonical(args)
        free = [u for u in self.of(number) if (u.round, u.id) not in self._taken]
        same_id = [u for u in free if u.id == use_id]
        if same_id:
            found = same_id[0]
            if (found.name, found.args) != (name, key):
                return MISMATCH, found
        else:
            exact = [u for u in free if u.name == name and u.args == key]
            if not exact:
                other = [u for u in free if u.name == name]
                return (MISMATCH, other[0]) if other else (MISSING, None)
            found = exact[0]
        if not found.answered:
            return MISSING, None
        self._taken.add((found.round, found.id))
        return RECORDED, found


def _uses(message: Mapping[str, Any], number: int) -> list[RecordedUse]:
    content = message.get("content")
    return [RecordedUse(number, b["id"], str(b.get("name")), b.get("input"),
                        canonical(b.get("input")), False)
            for b in content if isinstance(b, dict) and b.get("type") == "tool_use"
            and isinstance(b.get("id"), str)] if isinstance(content, list) else []


def _results(replay: Replay, after: int, uses: Sequence[RecordedUse]
             ) -> dict[str, tuple[int, Any, bool]]:
    """The results of ``uses`` in the messages after ``after``, before the next answer (one
    turn at a time: its results come first): id -> (message index, content, is_error), the
    first result of each id (ids may repeat in other turns)."""
    wanted = {use.id for use in uses}
    found: dict[str, tuple[int, Any, bool]] = {}
    for index in range(after + 1, len(replay.messages)):
        if not wanted - found.keys():
            break
        message = replay.messages[index]
        content = message.get("content")
        if message.get("role") == "assistant":
            break
        if message.get("role") != "user" or not isinstance(content, list):
            continue
        for block in content:
            if (isinstance(block, dict) and block.get("type") == "tool_result"
                    and block.get("tool_use_id") in wanted
                    and block["tool_use_id"] not in found):
                found[block["tool_use_id"]] = (index, block.get("content", ""),
                                               bool(block.get("is_error")))
    return found


def _answered(use: RecordedUse, results: Mapping[str, tuple[int, Any, bool]]) -> RecordedUse:
    if use.id not in results:
        return use
    _, content, is_error = results[use.id]
    return RecordedUse(use.round, use.id, use.name, use.input, use.args, True, content,
                       is_error)


def _sent_results(replay: Replay, call: Call,
                  results: Mapping[str, tuple[int, Any, bool]]) -> Call | None:
    """The call of the same turn that was sent these results and answered: the next call
    (after ``call``) whose window holds the results message; None when the turn ended."""
    if not results:
        return None
    at = max(index for index, _, _ in results.values())
    for later in replay.calls[call.index:]:
        if (later.window is not None and later.assistant is not None
                and any(start <= at < end for start, end in later.window)
                and not (later.lineage is not None and later.lineage.reason == "compaction")):
            return later
    return None


async def resolve(uses: Sequence[Mapping[str, Any]], recorded: RecordedRounds, number: int,
                  live: ToolSet | None, context: ChannelContext) -> list[ToolStep]:
    """Results for the tool calls of one rerun answer, its round ``number`` (see the module
    docstring)."""
    steps: list[ToolStep] = []
    for use in uses:
        name, args, call_id = str(use.get("name")), use.get("input") or {}, str(use.get("id"))
        source, found = recorded.match(number, call_id, name, args)
        before = found.content if source == RECORDED and found is not None else None
        if live is not None and name in live:
            result = await live.run(name, args, context)
            steps.append(ToolStep(call_id, name, args, LIVE, result.content(), result.is_error,
                                  before, number, found))
        elif source == RECORDED and found is not None:
            steps.append(ToolStep(call_id, name, args, RECORDED, found.content, found.is_error,
                                  found.content, number, found))
        else:
            steps.append(ToolStep(call_id, name, args, source, round=number, matched=found))
    return steps


def results_message(steps: Sequence[ToolStep]) -> MessageDict:
    """The tool-results message the rerun's next call sends (as the agent loop builds it)."""
    blocks: list[dict[str, Any]] = []
    for step in steps:
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": step.id,
                                 "content": step.content}
        if step.is_error:
            block["is_error"] = True
        blocks.append(block)
    return {"role": "user", "content": blocks}
