"""The agent loop plans prompt-cache breakpoints, records the plan, and replay rebuilds them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.agent.prompt import stable_prefix
from gateway.persona.workspace import OPERATOR_SECTIONS
from sessions.jsonl import JsonlSessionStore
from sessions.records import CachePlan, Section
from sessions.replay import Replay, replay_bytes
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.harness import running_core


async def converse(tmp_path: Path, provider: ScriptedProvider, *,
                   prompt_cache: bool = True) -> tuple[Replay, list[dict[str, Any]]]:
    """Two turns in one chat: the replay and the log's call entries."""
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p",
                            prompt_cache=prompt_cache) as core:
        accepted = await core.channel.say("c1", "hi")
        await core.channel.wait_replies(1)
        await core.channel.say("c1", "and again")
        await core.channel.wait_replies(2)
        assert accepted is not None
        data = await core.store.read_log("default", accepted.session_id)
    entries = [orjson.loads(line) for line in data.splitlines()]
    return replay_bytes(data), [e for e in entries if e["type"] == "call"]


async def test_plan_is_recorded_and_replayed_into_the_body(tmp_path: Path) -> None:
    """Anthropic shape: every call entry holds the plan, and replay rebuilds the marked body."""
    provider = ScriptedProvider()
    replay, calls = await converse(tmp_path, provider)
    turn = replay.calls[0]
    assert turn.prompt is not None
    sections = [Section(ref.name, ref.text or "") for ref in turn.prompt.sections]
    stable = stable_prefix(sections, OPERATOR_SECTIONS)
    assert stable >= 1  # the default persona opens with its soul
    plan = CachePlan(tools=True, system=stable, history=True)
    assert [e["cache"] for e in calls] == [plan.to_json()] * 2
    assert [t.cache for t in replay.calls] == [plan, plan]
    assert [replay.request(t) for t in replay.calls] == provider.bodies
    assert "cache_control" in str(provider.bodies[1]["system"])
    assert provider.bodies[1]["messages"][-1]["content"][-1]["cache_control"] == {
        "type": "ephemeral"}


@pytest.mark.parametrize(("shape", "prompt_cache"), [("anthropic", False), ("openai", True)])
async def test_no_plan_when_off_or_for_openai(tmp_path: Path, shape: str,
                                              prompt_cache: bool) -> None:
    """With caching off, or an OpenAI-shaped provider, calls carry no plan and no markers."""
    provider = ScriptedProvider(shape="openai" if shape == "openai" else "anthropic")
    replay, calls = await converse(tmp_path, provider, prompt_cache=prompt_cache)
    assert len(calls) == 2
    assert all("cache" not in e for e in calls)
    assert "cache_control" not in orjson.dumps(provider.bodies).decode()
    assert [replay.request(t, provider.shape) for t in replay.calls] == provider.bodies
