"""Tool calls in a rerun: answered from the session's recorded results, or run live.

A rerun that asks for a tool gets, by default, the result the session recorded for the same
tool with the same input (the one given to the model, byte for byte), so a counterfactual turn
goes on without touching the outside world. With ``--live-tools`` the configured MCP servers
run the call again and the rerun shows whether the new result differs from the recorded one.
Persona tools never run in a rerun (they would edit the persona files). A call with neither a
recorded nor a live result is shown, not executed, and the rerun stops there: it never makes
up a result the model would take for real.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.agent.tools import ToolSet
from gateway.edge.messages import ChannelContext
from sessions.records import MessageDict
from sessions.replay import Replay

RECORDED = "recorded"
LIVE = "live"
MISSING = "not executed"


@dataclass(frozen=True, slots=True)
class ToolStep:
    """One tool call of a rerun answer and where its result came from."""

    id: str
    name: str
    input: Any
    source: str
    """``recorded``, ``live`` or ``not executed``."""
    content: Any = None
    """The tool_result content given to the model (None when not executed)."""
    is_error: bool = False
    recorded: Any = None
    """The recorded content for the same call, when there is one."""

    @property
    def differs(self) -> bool | None:
        """For a live result: whether it differs from the recorded one (None: nothing to
        compare with, or not live)."""
        if self.source != LIVE or self.recorded is None:
            return None
        return bool(self.content != self.recorded)

    def json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "input": self.input, "source": self.source,
                "result": self.content, "isError": self.is_error, "recorded": self.recorded,
                "differs": self.differs}


def _key(name: str, args: Any) -> tuple[str, str]:
    # Python's json: total over what a log holds (integers past 64 bits, NaN), keys sorted.
    return name, json.dumps(args, sort_keys=True, default=str)


class RecordedResults:
    """Every tool result of a session, by tool name and input, in log order."""

    def __init__(self, replay: Replay) -> None:
        uses: dict[str, tuple[str, str, int]] = {}
        self._found: dict[tuple[str, str], list[tuple[int, Any, bool]]] = {}
        for index, message in enumerate(replay.messages):
            content = message.get("content")
            if not isinstance(content, list):
                continue
            for block in content:
                if not isinstance(block, dict):
                    continue
                if block.get("type") == "tool_use" and isinstance(block.get("id"), str):
                    name, args = _key(str(block.get("name")), block.get("input"))
                    uses[block["id"]] = (name, args, index)
                elif block.get("type") == "tool_result" and block.get("tool_use_id") in uses:
                    name, args, at = uses[block["tool_use_id"]]
                    self._found.setdefault((name, args), []).append(
                        (at, block.get("content", ""), bool(block.get("is_error"))))

    def find(self, name: str, args: Any, near: int) -> tuple[Any, bool] | None:
        """The recorded result of ``name(args)``: the first at or after message ``near`` (the
        rerun turn's own round, when the model asks the same again), else the last before."""
        found = self._found.get(_key(name, args))
        if not found:
            return None
        after = [item for item in found if item[0] >= near]
        _, content, is_error = after[0] if after else found[-1]
        return content, is_error


async def resolve(uses: Sequence[Mapping[str, Any]], recorded: RecordedResults, near: int,
                  live: ToolSet | None, context: ChannelContext) -> list[ToolStep]:
    """Results for the tool calls of one rerun answer (see the module docstring)."""
    steps: list[ToolStep] = []
    for use in uses:
        name, args, call_id = str(use.get("name")), use.get("input") or {}, str(use.get("id"))
        found = recorded.find(name, args, near)
        before = found[0] if found is not None else None
        if live is not None and name in live:
            result = await live.run(name, args, context)
            steps.append(ToolStep(call_id, name, args, LIVE, result.content(),
                                  result.is_error, before))
        elif found is not None:
            steps.append(ToolStep(call_id, name, args, RECORDED, found[0], found[1], before))
        else:
            steps.append(ToolStep(call_id, name, args, MISSING))
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
