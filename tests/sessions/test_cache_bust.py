"""Cache-busting changes (sessions.cache_bust) and their flag in drift rows."""

from __future__ import annotations

from typing import Any

import pytest

from sessions import entries
from sessions.cache_bust import CacheBust, cache_busts
from sessions.drift import drift
from sessions.fingerprint import tools_fingerprint
from sessions.records import CachePlan, Outcome, Prompt
from sessions.replay import replay_bytes
from tests.sessions.helpers import (
    MEMORY_1,
    MEMORY_2,
    MOOD,
    SOUL,
    TOOLS_A,
    TOOLS_B,
    assistant,
    call_request,
    make_prompt,
    sha16,
    user,
)

A = make_prompt(("soul", SOUL), ("memory", MEMORY_1), ("mood", MOOD))
B = make_prompt(("soul", SOUL), ("memory", MEMORY_2), ("mood", MOOD))
NEW_SOUL = make_prompt(("soul", SOUL + " Be brief."), ("memory", MEMORY_1), ("mood", MOOD))
PLAN = CachePlan(system=1)
LONGER = make_prompt(("soul", SOUL), ("memory", MEMORY_1), ("mood", MOOD), ("kb", "- a note"))


class Log:
    """A v3 log written call by call, as the loop writes it."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = [
            {"type": "session", "version": 3, "id": "s", "startedAt": "t", "channel": "web",
             "conversation": "c", "tenant": "default"}]
        self.sections: set[str] = set()
        self.prompts: set[str] = set()
        self.tool_sets: set[str] = set()
        self.messages = 0
        self.calls = 0

    def call(self, prompt: Prompt, *, plan: CachePlan | None = PLAN,
             tools: tuple[Any, ...] = TOOLS_A, usage: dict[str, int] | None = None) -> None:
        self.items.append(entries.message(user(f"q{self.calls}")))
        self.messages += 1
        for section in prompt.sections:
            if sha16(section.text) not in self.sections:
                self.sections.add(sha16(section.text))
                self.items.append(entries.section(sha16(section.text), section.text))
        if prompt.fingerprint not in self.prompts:
            self.prompts.add(prompt.fingerprint)
            self.items.append(entries.prompt(prompt.fingerprint, "rebuilt",
                                             [(s.name, sha16(s.text)) for s in prompt.sections]))
        fp = tools_fingerprint(tools)
        if fp not in self.tool_sets:
            self.tool_sets.add(fp)
            self.items.append(entries.tools(fp, tools))
        request = call_request(prompt, ((0, self.messages),), tools=tools)
        body = entries.call(self.calls, request, fp)
        if plan is not None:
            body["cache"] = plan.to_json()
        self.items += [body, entries.message(assistant("a")),
                       entries.outcome(Outcome(call=self.calls, usage=usage or {}))]
        self.messages += 1
        self.calls += 1

    def busts(self) -> list[CacheBust]:
        return cache_busts(replay_bytes(self.bytes()))

    def bytes(self) -> bytes:
        return b"".join(entries.encode_line(item, seq, "t") + b"\n"
                        for seq, item in enumerate(self.items))


def test_memory_change_busts_from_memory_on() -> None:
    """Call 3's new memory section is the first change; outside the one-section stable prefix."""
    log = Log()
    log.call(A, usage={"cache_creation_input_tokens": 900})
    log.call(A, usage={"cache_read_input_tokens": 900, "cache_creation_input_tokens": 20})
    log.call(B, usage={"cache_read_input_tokens": 300})
    [bust] = log.busts()
    assert bust == CacheBust(call=3, version=2, section="memory", stable=False,
                             cached_before=920, read_after=300)
    assert bust.message == "cache-busting change in section memory"


def test_soul_change_is_in_the_stable_prefix() -> None:
    """A change to a section inside the plan's stable prefix says so."""
    log = Log()
    log.call(A)
    log.call(NEW_SOUL)
    [bust] = log.busts()
    # No usage was recorded, so how much the cache held is unknown, not zero.
    assert (bust.section, bust.stable, bust.cached_before, bust.read_after) == (
        "soul", True, None, None)


def test_tools_come_first_and_an_added_section_counts() -> None:
    """A new tool set busts everything ("tools"); a section added at the end is the change."""
    log = Log()
    log.call(A)
    log.call(A, tools=TOOLS_B)
    log.call(LONGER, tools=TOOLS_B)
    assert [(b.call, b.section, b.message) for b in log.busts()] == [
        (2, "tools", "cache-busting change in tools"),
        (3, "kb", "cache-busting change in section kb")]


@pytest.mark.parametrize(
    ("usage", "busted"),
    [(None, False), ({"input_tokens": 2000}, False), ({"cache_read_input_tokens": 1024}, True)],
)
def test_without_a_plan_only_a_reported_cache_counts(usage: dict[str, int] | None,
                                                     busted: bool) -> None:
    """With no breakpoints (OpenAI), a change busts only when the provider reported caching."""
    log = Log()
    log.call(A, plan=None, usage=usage)
    log.call(B, plan=None)
    assert bool(log.busts()) is busted


def test_unchanged_prompt_is_no_bust() -> None:
    """Calls with the same tools and prompt bust nothing."""
    log = Log()
    for _ in range(3):
        log.call(A)
    assert log.busts() == []


def test_drift_flags_the_busting_section() -> None:
    """Drift rows mark exactly the section and version that busted the cache."""
    log = Log()
    log.call(A)
    log.call(B)
    flagged = [(p.version, p.section) for p in drift(replay_bytes(log.bytes())) if p.cache_bust]
    assert flagged == [(2, "memory")]

