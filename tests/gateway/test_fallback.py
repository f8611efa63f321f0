"""Fallbacks: after an overload or a 5xx the next provider/model answers; every attempt is its
own recorded call with its reason, and replays to what its provider received."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from app.config import Settings
from gateway.edge.errors import (
    ProviderError,
    ProviderRateLimited,
    ProviderTimeout,
    ProviderUnavailable,
)
from sessions.jsonl import JsonlSessionStore
from sessions.replay import Replay
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.harness import running_core

OVERLOADED = ProviderUnavailable("primary: HTTP 529 overloaded_error", status=529)


async def one_turn(tmp_path: Path, providers: list[ScriptedProvider]) -> tuple[Replay, str]:
    async with running_core(JsonlSessionStore(tmp_path / "d"), providers[0], tmp_path / "p",
                            fallbacks=providers[1:]) as core:
        accepted = await core.channel.say("c1", "hello?")
        [(_, _, text)] = await core.channel.wait_replies(1)
        assert accepted is not None
        return await core.replay(accepted.session_id or ""), text


def reasons(replay: Replay) -> list[tuple[str | None, str | None, int | None]]:
    """(provider, reason, after) of every call."""
    return [(t.provider, t.lineage.reason if t.lineage else None,
             t.lineage.after if t.lineage else None) for t in replay.calls]


async def test_overload_falls_back_and_every_attempt_is_recorded(tmp_path: Path) -> None:
    """A 529 from the primary: the fallback (another shape, another model) answers; the log
    holds both calls, the second with reason fallback after the first, each rebuildable as
    its own provider received it."""
    primary = ScriptedProvider(name="anthropic", model="claude-big")
    fallback = ScriptedProvider(name="openai", shape="openai", model="gpt-small")
    primary.script(OVERLOADED)
    fallback.script("from the fallback")
    replay, text = await one_turn(tmp_path, [primary, fallback])
    assert text == "from the fallback"
    assert reasons(replay) == [("anthropic", None, None), ("openai", "fallback", 0)]
    first, second = replay.calls
    assert replay.outcome_of(first).error == {  # type: ignore[union-attr]
        "kind": "unavailable", "message": "primary: HTTP 529 overloaded_error"}
    assert first.assistant is None
    assert second.assistant is not None
    assert (second.model, second.cache) == ("gpt-small", None)  # OpenAI takes no breakpoints
    assert replay.request(first, "anthropic") == primary.bodies[0]
    assert replay.request(second, "openai") == fallback.bodies[0]


async def test_fallbacks_are_tried_in_order_until_one_answers(tmp_path: Path) -> None:
    """Two overloaded providers, then one that answers: three calls, chained by `after`."""
    providers = [ScriptedProvider(name=f"p{n}", model=f"m{n}") for n in range(3)]
    providers[0].script(OVERLOADED)
    providers[1].script(ProviderUnavailable("p1: could not connect"))
    providers[2].script("third time")
    replay, text = await one_turn(tmp_path, providers)
    assert text == "third time"
    assert reasons(replay) == [("p0", None, None), ("p1", "fallback", 0), ("p2", "fallback", 1)]


@pytest.mark.parametrize("error", [
    ProviderRateLimited("p0: HTTP 429", status=429),
    ProviderTimeout("p0: no answer within the timeout"),
    ProviderError("p0: HTTP 400 invalid_request_error", status=400),
])
async def test_other_failures_do_not_fall_back(tmp_path: Path, error: ProviderError) -> None:
    """Rate limits, timeouts and bad requests end the turn with the apology: one call."""
    primary, fallback = ScriptedProvider(name="p0"), ScriptedProvider(name="p1")
    primary.script(error)
    replay, text = await one_turn(tmp_path, [primary, fallback])
    assert text.startswith("Sorry")
    assert reasons(replay) == [("p0", None, None)]
    assert fallback.bodies == []


async def test_when_every_attempt_fails_the_turn_apologises(tmp_path: Path) -> None:
    """All overloaded: the apology, and every attempt recorded with its error."""
    primary, fallback = ScriptedProvider(name="p0"), ScriptedProvider(name="p1")
    primary.script(OVERLOADED)
    fallback.script(ProviderUnavailable("p1: HTTP 503", status=503))
    replay, text = await one_turn(tmp_path, [primary, fallback])
    assert text.startswith("Sorry")
    assert reasons(replay) == [("p0", None, None), ("p1", "fallback", 0)]
    assert [replay.outcome_of(t).error["kind"] for t in replay.calls] == [  # type: ignore[index,union-attr]
        "unavailable", "unavailable"]


@pytest.mark.parametrize(("value", "pairs"), [
    ("", []),
    ("anthropic:claude-haiku-4-5", [("anthropic", "claude-haiku-4-5")]),
    (" openai:gpt-4o-mini , offline:offline-1 ", [("openai", "gpt-4o-mini"),
                                                 ("offline", "offline-1")]),
])
def test_fallbacks_setting(value: str, pairs: list[tuple[str, str]]) -> None:
    """GATEWAY_FALLBACKS is an ordered list of provider:model."""
    settings = Settings(_env_file=None, GATEWAY_FALLBACKS=value)  # type: ignore[call-arg]
    assert settings.fallback_list == pairs


@pytest.mark.parametrize("value", ["claude-haiku", "gemini:pro", "openai:", ":gpt"])
def test_bad_fallbacks_setting_names_the_setting(value: str) -> None:
    """A malformed entry is refused, naming the setting and the expected form."""
    with pytest.raises(ValidationError, match="provider:model") as caught:
        Settings(_env_file=None, GATEWAY_FALLBACKS=value)  # type: ignore[call-arg]
    assert "GATEWAY_FALLBACKS" in str(caught.value)
