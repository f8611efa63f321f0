"""``gateway replay ID --rerun N``: a recorded call sent again, as recorded or ablated, to a
local server speaking the Anthropic API (driven by the real SDK), never touching the session."""

from __future__ import annotations

import asyncio
import io
import stat
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.cli import main as cli_main
from providers.anthropic import AnthropicProvider
from sessions.ablation import Ablation, RerunError, ablate, rerun_request
from sessions.jsonl import JsonlSessionStore
from sessions.records import PROMPT_JOINER
from sessions.replay import Call, Replay, replay_bytes
from tests.fakes.providers import FakeProviderServer, Reply, system_text
from tests.gateway.harness import running_core

SEED_DIR = Path(__file__).parents[2] / "sessions" / "fixtures" / "seed-format"
PERSONA = {
    "SOUL.md": "You are Lisa, a calm assistant.\n",
    "USER.md": "Name: Ada.\n",
    "MEMORY.md": "- Ada likes green tea.\n",
    "MOOD.md": "cheerful\n",
}
NEW_SOUL = "You are Bob, a grumpy pirate.\nYou answer in one word.\n"
RERUN_TOOL = ("memory_write", {"text": "Ada hates tea"})


class Recorded:
    """A session recorded through a real gateway core (persona, tools, the persist step)."""

    def __init__(self, data: Path, session: str) -> None:
        self.data = data
        self.session = session
        self.path = data / "sessions" / f"{session}.jsonl"

    def replay(self) -> Replay:
        return replay_bytes(self.path.read_bytes())

    def call(self, number: int) -> Call:
        return self.replay().call(number)

    def persona(self) -> dict[str, bytes]:
        root = self.data / "persona"
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
                if p.is_file()}


async def record(tmp_path: Path, srv: FakeProviderServer) -> Recorded:
    """Two user turns, the second with a memory_write tool round: three provider calls."""
    data = tmp_path / "data"
    persona = data / "persona"
    persona.mkdir(parents=True)
    for name, text in PERSONA.items():
        (persona / name).write_text(text)
    srv.script("anthropic", Reply.text("Hello Ada."),
               Reply.tool_use("memory_write", {"text": "Ada prefers short answers"},
                              text_before="Saving that."),
               Reply.text("Noted."))
    provider = AnthropicProvider(api_key="test-key", model="claude-test",
                                 base_url=srv.anthropic_base_url, max_retries=0)
    try:
        async with running_core(JsonlSessionStore(data), provider, persona) as core:
            accepted = await core.channel.say("c1", "hi, I'm Ada")
            await core.channel.wait_replies(1)
            await core.channel.say("c1", "remember that I like short answers")
            await core.channel.wait_replies(2)
    finally:
        await provider.aclose()
    assert accepted is not None
    assert accepted.session_id
    return Recorded(data, accepted.session_id)


def cli(data: Path, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli_main(["replay", "--data-dir", str(data), *args])
    return code, out.getvalue(), err.getvalue()


async def acli(data: Path, *args: str) -> tuple[int, str, str]:
    """The CLI runs its own event loop (asyncio.run): off this one, which serves the fake."""
    return await asyncio.to_thread(cli, data, *args)


@pytest.fixture
def anthropic_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("GATEWAY_MODEL", "OPENAI_API_KEY", "OPENAI_BASE_URL", "GATEWAY_STREAM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    monkeypatch.setenv("GATEWAY_PROVIDER", "anthropic")
    monkeypatch.setenv("GATEWAY_PROVIDER_RETRIES", "0")
    return monkeypatch


def system_of(turn: Call, *, drop: str = "", replace: tuple[str, str] = ("", "")) -> str:
    """The system prompt text expected after an ablation, joined independently of the code."""
    assert turn.prompt is not None
    texts = []
    for ref in turn.prompt.sections:
        if ref.name == drop:
            continue
        texts.append(replace[1] if ref.name == replace[0] else ref.text)
    return "\n\n".join(t for t in texts if t)


def saved_log(path: Path) -> tuple[bytes, tuple[int, ...]]:
    """A saved rerun log's bytes and the modes of it, its tenant directory and ``reruns/``."""
    modes = tuple(stat.S_IMODE(p.stat().st_mode) for p in (path, path.parent, path.parent.parent))
    return path.read_bytes(), modes


def without(body: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != key}


async def test_plain_rerun_sends_exactly_the_recorded_request(
    tmp_path: Path, anthropic_env: pytest.MonkeyPatch
) -> None:
    """Without ablation the fake receives the body replay rebuilds for that turn, unchanged."""
    async with FakeProviderServer() as srv:
        rec = await record(tmp_path, srv)
        anthropic_env.setenv("ANTHROPIC_BASE_URL", srv.anthropic_base_url)
        srv.script("anthropic", Reply.text("Hello again, Ada."))
        code, out, err = await acli(rec.data, rec.session, "--rerun", "3")
        received = srv.requests[-1].body
    assert (code, err) == (0, "")
    replay = rec.replay()
    assert received == replay.request(replay.call(3))
    assert len(srv.requests) == 4
    turn = replay.call(3)
    assert turn.prompt is not None
    assert f"prompt    recorded {turn.prompt.fingerprint} -> rerun {turn.prompt.fingerprint} " \
           "(unchanged)" in out
    assert "--- recorded answer (stop end_turn)\nNoted.\n" in out
    assert "--- new answer (stop end_turn" in out
    assert out.endswith("Hello again, Ada.\n")


async def test_drop_section_sends_the_request_minus_that_section(
    tmp_path: Path, anthropic_env: pytest.MonkeyPatch
) -> None:
    """--drop-section mood: same body but the system prompt lacks exactly the mood section."""
    async with FakeProviderServer() as srv:
        rec = await record(tmp_path, srv)
        anthropic_env.setenv("ANTHROPIC_BASE_URL", srv.anthropic_base_url)
        code, out, _ = await acli(rec.data, rec.session, "--rerun", "3", "--drop-section", "mood")
        received = srv.requests[-1].body
    assert code == 0
    turn = rec.call(3)
    assert turn.prompt is not None
    assert [s.name for s in turn.prompt.sections] == ["soul", "user", "notes", "memory", "mood",
                                                      "channel"]
    expected = rec.replay().request(turn)
    assert "cheerful" in system_text(expected)
    assert system_text(received) == system_of(turn, drop="mood")
    assert "cheerful" not in system_text(received)
    assert without(received, "system") == without(expected, "system")
    assert "dropped: mood" in out
    assert "sections  soul, user, notes, memory, channel\n" in out


async def test_replace_section_swaps_its_text_and_shows_tool_calls_unexecuted(
    tmp_path: Path, anthropic_env: pytest.MonkeyPatch
) -> None:
    """--replace-section soul=FILE sends FILE's text; a new tool call is shown, never run."""
    soul_file = tmp_path / "bob.md"
    soul_file.write_text(NEW_SOUL)
    async with FakeProviderServer() as srv:
        rec = await record(tmp_path, srv)
        anthropic_env.setenv("ANTHROPIC_BASE_URL", srv.anthropic_base_url)
        persona_before = rec.persona()
        log_before, stat_before = rec.path.read_bytes(), rec.path.stat()
        srv.script("anthropic", Reply.tool_use(*RERUN_TOOL, text_before="Arr."))
        code, out, _ = await acli(rec.data, rec.session, "--rerun", "3",
                                  "--replace-section", f"soul={soul_file}")
        received = srv.requests[-1].body
        assert len(srv.requests) == 4  # one call: the tool was not run, so no follow-up call
    assert code == 0
    turn = rec.call(3)
    expected = rec.replay().request(turn)
    assert system_text(received) == system_of(turn, replace=("soul", NEW_SOUL))
    assert system_text(received).startswith(NEW_SOUL + PROMPT_JOINER)
    assert without(received, "system") == without(expected, "system")
    assert f"replaced: soul (text from {soul_file.resolve()})" in out
    assert "tool calls are shown, not executed" in out
    assert 'Arr.\n[tool call, NOT executed] memory_write {"text":"Ada hates tea"}\n' in out
    assert rec.persona() == persona_before
    assert rec.path.read_bytes() == log_before
    after = rec.path.stat()
    assert (after.st_mtime_ns, after.st_size) == (stat_before.st_mtime_ns, stat_before.st_size)


async def test_save_writes_a_separate_log_whose_request_replays_exactly(
    tmp_path: Path, anthropic_env: pytest.MonkeyPatch
) -> None:
    """--save writes reruns/<tenant>/<id>.jsonl whose --request 1 is what the fake received."""
    async with FakeProviderServer() as srv:
        rec = await record(tmp_path, srv)
        anthropic_env.setenv("ANTHROPIC_BASE_URL", srv.anthropic_base_url)
        log_before, mtime_before = rec.path.read_bytes(), rec.path.stat().st_mtime_ns
        srv.script("anthropic", Reply.tool_use(*RERUN_TOOL))
        code, out, _ = await acli(rec.data, rec.session, "--rerun", "3", "--drop-section",
                                  "mood", "--save", "--json")
        received = srv.requests[-1].body
    assert code == 0
    view = orjson.loads(out)
    saved = Path(view["saved"])
    assert saved.parent == rec.data / "reruns" / "default"
    data, modes = saved_log(saved)
    assert modes == (0o600, 0o700, 0o700)
    turn = rec.call(3)
    assert turn.prompt is not None
    header = orjson.loads(data.splitlines()[0])
    assert header["version"] == 3
    assert header["rerunOf"] == {"session": rec.session, "tenant": "default", "call": 3,
                                 "promptFingerprint": turn.prompt.fingerprint}
    assert header["ablation"] == {"drop": ["mood"], "replace": {}}
    code, request, _ = await acli(rec.data, str(saved), "--request", "1")
    assert code == 0
    assert orjson.loads(request) == received
    code, summary, _ = await acli(rec.data, str(saved))
    assert code == 0
    assert f"  rerun of call 3 of session {rec.session} (tenant default)\n" in summary
    rerun = replay_bytes(data)
    assert rerun.problems == ()
    assert [p.reason for p in rerun.prompts] == ["rerun:ablated"]
    answer = rerun.call(1)
    assert answer.assistant is not None
    assert rerun.messages[answer.assistant] == view["rerun"]["assistant"]
    assert answer.endpoint == f"http://127.0.0.1:{srv.port}"  # the rerun's call, recorded
    outcome = rerun.outcome_of(answer)
    assert outcome is not None
    assert outcome.stop_reason == "tool_use"
    assert view["rerun"]["toolCalls"][0]["name"] == "memory_write"
    assert view["rerun"]["toolsExecuted"] is False
    assert view["prompt"]["rerun"] == rerun.prompts[0].fingerprint != turn.prompt.fingerprint
    assert rec.path.read_bytes() == log_before
    assert rec.path.stat().st_mtime_ns == mtime_before


async def test_unknown_section_exits_2_listing_the_available_ones(
    tmp_path: Path, anthropic_env: pytest.MonkeyPatch
) -> None:
    """An unknown section name is a usage error naming every section; nothing is sent."""
    async with FakeProviderServer() as srv:
        rec = await record(tmp_path, srv)
        anthropic_env.setenv("ANTHROPIC_BASE_URL", srv.anthropic_base_url)
        code, out, err = await acli(rec.data, rec.session, "--rerun", "2",
                                    "--drop-section", "soull")
        assert len(srv.requests) == 3
    assert (code, out) == (2, "")
    assert err == ("gateway replay: unknown section 'soull'; available: soul, user, notes, "
                   "mood, channel\n")


async def test_offline_rerun_needs_no_network_or_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without an API key the rerun falls back to offline, says so, and needs no server."""
    async with FakeProviderServer() as srv:
        rec = await record(tmp_path, srv)
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL",
                 "GATEWAY_PROVIDER", "GATEWAY_MODEL"):
        monkeypatch.delenv(name, raising=False)
    code, out, err = await acli(rec.data, rec.session, "--rerun", "1", "--drop-section", "mood",
                                "--save")
    assert (code, err) == (0, "")
    assert "provider  offline (recorded: anthropic)" in out
    assert "note: recorded provider anthropic is not configured (ANTHROPIC_API_KEY is not set)" \
        in out
    assert "hi, I'm Ada" in out  # the offline provider quotes the user
    saved = next((rec.data / "reruns" / "default").glob("*.jsonl"))
    rerun = replay_bytes(saved.read_bytes())
    assert rerun.call(1).provider == "offline"


async def test_v2_prompt_is_one_section_and_v1_has_none_to_ablate(tmp_path: Path) -> None:
    """A v2 prompt is one section "prompt"; a v1 turn has no prompt to ablate (exit 2)."""
    new = tmp_path / "short.md"
    new.write_text("Be brief.")
    code, out, err = await acli(tmp_path, str(SEED_DIR / "v2-prompt-timeline.jsonl"), "--rerun",
                                "2", "--provider", "offline", "--replace-section",
                                f"prompt={new}", "--json")
    assert (code, err) == (0, "")
    view = orjson.loads(out)
    assert view["prompt"]["recordedSections"] == ["prompt"]
    assert view["prompt"]["sections"] == ["prompt"]
    assert view["prompt"]["changed"] is True
    code, out, err = await acli(tmp_path, str(SEED_DIR / "v1-messages-only.jsonl"), "--rerun",
                                "1", "--provider", "offline", "--drop-section", "prompt")
    assert (code, out) == (2, "")
    assert "has no recorded system prompt" in err


async def test_rerun_options_without_rerun_are_a_usage_error(tmp_path: Path) -> None:
    """--drop-section without --rerun, or --rerun with --request, exits 2 instead of ignoring."""
    seed = str(SEED_DIR / "v2-prompt-timeline.jsonl")
    code, _, err = await acli(tmp_path, seed, "--drop-section", "prompt")
    assert code == 2
    assert err == "gateway replay: --drop-section only apply with --rerun N\n"
    code, _, err = await acli(tmp_path, seed, "--rerun", "1", "--request", "1")
    assert code == 2
    assert err == "gateway replay: --rerun cannot be combined with --request\n"


def test_ablate_keeps_order_and_joiner_and_rejects_unknown_names() -> None:
    """ablate() drops and replaces by name, keeps section order, and lists names on error."""
    replay = replay_bytes((SEED_DIR / "v2-prompt-timeline.jsonl").read_bytes())
    version = replay.call(2).prompt
    assert version is not None
    assert ablate(version).text == version.text
    assert ablate(version, replace={"prompt": "x"}).text == "x"
    assert ablate(version, drop=["prompt"]).text == ""
    with pytest.raises(RerunError) as info:
        ablate(version, drop=["mood"])
    assert info.value.available == ("prompt",)
    parts = rerun_request(replay, replay.call(2), Ablation(replace={"prompt": "y"}), "m-1")
    assert (parts.model, parts.params, parts.replaced, parts.changed) == ("m-1", None,
                                                                        ("prompt",), True)
    assert list(parts.messages) == replay.sent(replay.call(2))


async def test_rerun_of_a_call_sent_with_the_old_glued_split_sends_it_the_same_way(
    tmp_path: Path, anthropic_env: pytest.MonkeyPatch
) -> None:
    """A call recorded before the cache split kept its joiner (its plan has no ``joined``)
    is rerun as it was sent, two sections run together, and the rerun says so."""
    async with FakeProviderServer() as srv:
        rec = await record(tmp_path, srv)
        rec.path.write_bytes(rec.path.read_bytes().replace(b',"joined":true', b""))
        anthropic_env.setenv("ANTHROPIC_BASE_URL", srv.anthropic_base_url)
        code, out, _ = await acli(rec.data, rec.session, "--rerun", "3")
        received = srv.requests[-1].body
    assert code == 0
    replay = rec.replay()
    call = replay.call(3)
    assert call.prompt is not None
    assert call.cache is not None
    assert not call.cache.joined
    assert received == replay.request(call)
    glued = call.cache.system
    assert [b["text"] for b in received["system"]] == [
        PROMPT_JOINER.join(r.text or "" for r in call.prompt.sections[:glued]),
        PROMPT_JOINER.join(r.text or "" for r in call.prompt.sections[glued:])]
    assert (f"note: the call was sent with an older prompt-cache split that ran sections "
            f"{glued} and {glued + 1} together; the rerun sends it the same way\n") in out
