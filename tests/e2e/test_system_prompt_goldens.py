"""What the model read is what replay shows: for each request shape, each prompt-cache plan and
prompts with and without a tenant layer and a memory scope (built by the real persona
workspace), the system prompt's blocks as the real SDK put them on the wire join, byte for
byte, to ``systemPrompt`` of ``gateway replay --call N --json`` (and to the recorded prompt,
whose fingerprint it has), and the request replays to the very bytes sent.

One combination is also written out by hand (the golden): Anthropic with the live plan cuts
after the operator's sections, and the stable block ends with the blank line between them.
"""

from __future__ import annotations

import asyncio
import io
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.cli import main as cli_main
from gateway.edge.messages import ChannelContext
from gateway.edge.provider import ProviderRequest
from gateway.edge.scopes import scope_of
from gateway.persona.workspace import PersonaWorkspace
from providers.anthropic import AnthropicProvider
from providers.openai import OpenAIProvider
from sessions import entries
from sessions.fingerprint import fingerprint
from sessions.jsonl import JsonlSessionStore
from sessions.persist import persist_call
from sessions.records import CachePlan, CallRequest, Prompt
from sessions.shapes import encode_body
from tests.fakes.providers import FakeProviderServer

SHAPES = ("anthropic", "openai")
LAYERS = ("operator", "operator+tenant", "operator+tenant+memory")
PLANS = ("none", "live", "first-section", "whole-prompt", "no-system-breakpoint")
TOOL = {"name": "clock", "description": "Current time.", "input_schema": {"type": "object"}}
TENANT_TEXT = "This team sells tea."
MEMORY_TEXT = "Ada likes green tea."
CONTEXT = ChannelContext(channel="telegram", chat_type="private", speaker="Ada", tenant="T1",
                         chat="42", person="42")


def write_persona(root: Path, layers: str) -> None:
    """The operator's files (and the tenant's, when ``layers`` has it) as an operator writes
    them."""
    root.mkdir()
    (root / ".layout").write_text("scopes-1\n")
    (root / "SOUL.md").write_text("You are Nova.\n")
    (root / "USER.md").write_text("The operator runs a tea shop.\n")
    if "tenant" in layers:
        (root / "tenants" / "T1").mkdir(parents=True)
        (root / "tenants" / "T1" / "TENANT.md").write_text(TENANT_TEXT + "\n")


async def built_prompt(root: Path, layers: str) -> tuple[Prompt, int]:
    """The prompt the persona workspace builds for Ada's DM in tenant T1, and its stable
    prefix (the operator's sections)."""
    write_persona(root, layers)
    workspace = PersonaWorkspace(root)
    if "memory" in layers:
        await workspace.append_memory(scope_of(CONTEXT), MEMORY_TEXT)
    built = await workspace.build(CONTEXT)
    return built.prompt, built.stable


def plan_of(name: str, stable: int, sections: int) -> CachePlan | None:
    return {"none": None, "live": CachePlan(tools=True, system=stable, history=True),
            "first-section": CachePlan(system=1), "whole-prompt": CachePlan(system=sections),
            "no-system-breakpoint": CachePlan(system=0)}[name]


def system_blocks(body: dict[str, Any], shape: str) -> list[str]:
    """The texts the model reads as its system prompt, in order, from a received body."""
    if shape == "openai":
        first = body["messages"][0]
        assert first["role"] == "system"
        return [first["content"]]
    system = body["system"]
    return [system] if isinstance(system, str) else [block["text"] for block in system]


def replay_cli(data_dir: Path, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = cli_main(["replay", "--data-dir", str(data_dir), "--tenant", "T1", *args])
    return code, out.getvalue()


async def send_and_record(tmp_path: Path, shape: str, prompt: Prompt,
                          plan: CachePlan | None) -> tuple[bytes, dict[str, Any]]:
    """Record the call as the agent loop does (before sending), send it through the real
    provider and SDK to the fake server; the bytes and body the server received."""
    store = JsonlSessionStore(tmp_path / "data", durability="none")
    writer = await store.create(tenant="T1", channel="telegram", conversation="42",
                                session_id="s1")
    message = {"role": "user", "content": "hi"}
    async with FakeProviderServer() as srv:
        provider: AnthropicProvider | OpenAIProvider
        if shape == "anthropic":
            provider = AnthropicProvider("sk-test", "claude-test", max_retries=0,
                                         base_url=srv.anthropic_base_url)
        else:
            provider = OpenAIProvider("sk-test", "gpt-test", max_retries=0,
                                      base_url=srv.openai_base_url)
        try:
            await writer.append([entries.message(message)])
            await persist_call(writer, CallRequest(
                prompt=prompt, reason="initial", tools=(TOOL,), provider=provider.name,
                model=provider.model, params=provider.params(), window=((0, 1),), cache=plan))
            await provider.complete(ProviderRequest(
                prompt.text, [message], (TOOL,), provider.model, provider.params(),
                prompt.texts, plan, {}))
        finally:
            await provider.aclose()
            await writer.aclose()
            await store.aclose()
        assert srv.refused == []
        return srv.requests[-1].raw, srv.requests[-1].body


@pytest.mark.parametrize("plan_name", PLANS)
@pytest.mark.parametrize("layers", LAYERS)
@pytest.mark.parametrize("shape", SHAPES)
async def test_system_blocks_join_to_the_system_prompt_replay_shows(
    tmp_path: Path, shape: str, layers: str, plan_name: str
) -> None:
    """"".join(system block texts sent) == systemPrompt == the recorded prompt, for every
    shape x plan x layers; the fingerprint is of those bytes and the body replays exactly."""
    prompt, stable = await built_prompt(tmp_path / "persona", layers)
    assert (TENANT_TEXT in prompt.text) == ("tenant" in layers)
    assert (MEMORY_TEXT in prompt.text) == ("memory" in layers)
    plan = plan_of(plan_name, stable, len(prompt.sections))
    raw, body = await send_and_record(tmp_path, shape, prompt, plan)
    code, out = await asyncio.to_thread(replay_cli, tmp_path / "data", "s1", "--call", "1",
                                        "--json")
    assert code == 0
    shown = orjson.loads(out)
    blocks = system_blocks(body, shape)
    assert "".join(blocks) == shown["systemPrompt"] == prompt.text
    assert fingerprint(shown["systemPrompt"]) == shown["promptFingerprint"]
    assert (shown["status"], shown["notes"]) == ("rebuilt", [])
    code, rebuilt = await asyncio.to_thread(replay_cli, tmp_path / "data", "s1", "--request",
                                            "1", "--raw")
    assert code == 0
    assert rebuilt.encode() == raw
    cut = plan.system if shape == "anthropic" and plan is not None else 0
    assert len(blocks) == (2 if 0 < cut < len(prompt.sections) else 1)
    assert encode_body(body) == raw


async def test_golden_anthropic_live_plan_blocks(tmp_path: Path) -> None:
    """The live plan with every layer, written out by hand: the operator's two sections, the
    blank line after them, then the tenant, memory and channel sections."""
    prompt, stable = await built_prompt(tmp_path / "persona", "operator+tenant+memory")
    _, body = await send_and_record(tmp_path, "anthropic", prompt,
                                    plan_of("live", stable, len(prompt.sections)))
    assert body["system"] == [
        {"type": "text", "cache_control": {"type": "ephemeral"},
         "text": "You are Nova.\n\n## About the people you serve (from the operator)\n"
                 "The operator runs a tea shop.\n\n"},
        {"type": "text",
         "text": "## About this workspace (from the operator)\nThis team sells tea.\n\n"
                 "## What you remember about this person (memory_write adds to it)\n"
                 "Ada likes green tea.\n\n"
                 "## Where you are\nChannel: telegram · chat: private · speaking with: Ada"},
    ]
