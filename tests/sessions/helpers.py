"""Builders shared by the sessions tests: prompts, requests, messages, and log inspection."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from sessions import entries
from sessions.records import CallRequest, Injected, MessageDict, Prompt, Section, ToolSchema, Window
from sessions.store import SessionWriter

SEED_DIR = Path(__file__).parent / "fixtures" / "seed-format"

TOOL_TIME: dict[str, Any] = {
    "name": "get_time",
    "description": "Current time in a time zone",
    "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}}},
}
TOOL_MEMORY: dict[str, Any] = {
    "name": "memory_write",
    "description": "Remember a fact about the user",
    "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
}
TOOLS_A: tuple[ToolSchema, ...] = (TOOL_TIME,)
TOOLS_B: tuple[ToolSchema, ...] = (TOOL_TIME, TOOL_MEMORY)

SOUL = "You are Lisa, a helpful assistant."
MEMORY_1 = "## Memory\n- Ada likes tea."
MEMORY_2 = "## Memory\n- Ada likes tea.\n- Ada prefers short answers."
MOOD = "## Mood\ncalm"


def sha16(text: str) -> str:
    """The documented fingerprint, computed here independently of ``sessions.fingerprint``."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def make_prompt(*sections: tuple[str, str]) -> Prompt:
    return Prompt.from_sections([Section(name, text) for name, text in sections])


PROMPT_A = make_prompt(("soul", SOUL), ("memory", MEMORY_1), ("mood", MOOD))
PROMPT_B = make_prompt(("soul", SOUL), ("memory", MEMORY_2), ("mood", MOOD))


def call_request(
    prompt: Prompt,
    window: Window,
    *,
    reason: str = "initial",
    tools: tuple[ToolSchema, ...] = TOOLS_A,
    provider: str = "anthropic",
    model: str = "claude-test",
    params: dict[str, Any] | None = None,
    injected: tuple[Injected, ...] = (),
) -> CallRequest:
    return CallRequest(
        prompt=prompt,
        reason=reason,
        tools=tools,
        provider=provider,
        model=model,
        params=params if params is not None else {"max_tokens": 256},
        window=window,
        injected=injected,
    )


def user(text: str) -> MessageDict:
    return {"role": "user", "content": text}


def assistant(text: str) -> MessageDict:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


def tool_use(call_id: str, name: str, args: dict[str, Any], text: str = "") -> MessageDict:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    blocks.append({"type": "tool_use", "id": call_id, "name": name, "input": args})
    return {"role": "assistant", "content": blocks}


def tool_result(call_id: str, result: str) -> MessageDict:
    return {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": call_id, "content": result}],
    }


async def add(writer: SessionWriter, *messages: MessageDict) -> None:
    """Append message entries, as the agent loop does."""
    await writer.append([entries.message(m) for m in messages])


def log_entries(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def log_types(path: Path) -> list[str]:
    return [entry["type"] for entry in log_entries(path)]


def of_type(path: Path, kind: str) -> list[dict[str, Any]]:
    return [entry for entry in log_entries(path) if entry["type"] == kind]


def without_times(
    entry: dict[str, Any], keys: Sequence[str] = ("ts", "startedAt")
) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k not in keys}
