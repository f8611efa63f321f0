"""Fault injection through the web channel: a failing or hanging store, a failing provider.

What ``tests/gateway/test_turn.py`` already proves (over a memory channel, only the call entry
failing) is not repeated. Here every entry type fails (messages, calls, outcomes) while several
conversations talk over HTTP, and ``/metrics`` and ``/healthz`` are read over HTTP as an operator
would. Provider faults go through the real Anthropic and OpenAI SDK providers against the fake
provider server: each turn ends with the apology within a bound, the outcome entry records the
error kind, and ``/metrics`` counts the failed call.
"""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.agent.loop import APOLOGY
from sessions.jsonl import JsonlSessionStore
from sessions.replay import replay_bytes
from tests.fakes.providers import FOREVER, FakeProviderServer, Reply
from tests.fakes.scripted_provider import ScriptedProvider
from tests.fakes.store import Fault, FaultyStore
from tests.reliability.support import WebGateway, total, web_gateway, web_settings
from tests.web_ids import WEB_TENANT

PERSIST_TIMEOUT = 0.2
CONVERSATIONS = 6
MESSAGES = 3


async def talk(web: WebGateway, conversation: str, count: int) -> list[tuple[int, str]]:
    """Send ``count`` messages one after the other: (status, reply or error) each."""
    out = []
    for n in range(count):
        status, body = await web.chat(conversation, f"{conversation} message {n}")
        out.append((status, body.get("reply", body.get("error", ""))))
    return out


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), "ENOSPC"),
        (PermissionError(errno.EPERM, "Operation not permitted"), "EPERM"),
        (OSError(errno.EIO, "Input/output error"), "EIO"),
        ("hang", "timeout"),
    ],
)
async def test_failing_store_never_stops_the_answers(
    tmp_path: Path, fault: Fault, kind: str
) -> None:
    """With every write failing or hanging, web turns answer in time; metrics count; /healthz
    up; and once the store recovers, every call the provider received replays exactly."""
    store = FaultyStore()
    provider = ScriptedProvider()
    settings = web_settings(tmp_path / "data", GATEWAY_PERSIST_TIMEOUT=PERSIST_TIMEOUT)
    async with web_gateway(settings, provider=provider, store=store) as web:
        await talk(web, "warm-up", 1)  # sessions exist; from here on every append fails
        store.set_fault(fault)
        conversations = [f"c{n}" for n in range(CONVERSATIONS)]
        traffic = asyncio.gather(*(talk(web, c, MESSAGES) for c in conversations))
        health = []
        while not traffic.done():  # /healthz sampled every 50 ms while the traffic runs
            health.append((await web.get_text("/healthz"))[0])
            await asyncio.wait([traffic], timeout=0.05)
        results = await traffic
        during = await web.metrics_once("gateway_turns_total", 1 + CONVERSATIONS * MESSAGES)
        store.set_fault(None)
        after = await web.chat("c0", "recovered?")
    # Every answer came while the fault lasted (it is lifted only after them): a hanging
    # write, which lasts as long as the fault, was given up at its timeout. No clock is
    # read, so a busy machine cannot fail this.
    answers = [(status, reply) for result in results for status, reply in result]
    assert answers == [(200, "ok")] * CONVERSATIONS * MESSAGES
    assert health
    assert set(health) == {200}
    assert total(during, "gateway_persist_failures_total", kind=kind) >= CONVERSATIONS * MESSAGES
    assert total(during, "gateway_turns_total", outcome="answered") == 1 + CONVERSATIONS * MESSAGES
    assert store.faults_raised >= CONVERSATIONS * MESSAGES
    assert after == (200, {"session": after[1]["session"], "reply": "ok"})
    # After recovery the logs hold every call (accepted entries were written in order, with
    # their seq), so each replays to the very body the provider received.
    rebuilt = []
    for info in await store.list_sessions(WEB_TENANT):
        log = replay_bytes(await store.read_log(WEB_TENANT, info.session_id))
        assert log.problems == ()
        assert [t.status for t in log.calls] == ["rebuilt"] * len(log.calls)
        rebuilt += [log.request(t, "anthropic") for t in log.calls]
        if info.session_id == after[1]["session"]:
            assert "recovered?" in [m["content"] for m in log.messages]
    assert len(provider.bodies) == 2 + CONVERSATIONS * MESSAGES
    assert sorted(map(orjson.dumps, rebuilt)) == sorted(map(orjson.dumps, provider.bodies))


# -- provider faults through the real SDKs -------------------------------------------------------

PROVIDER_TIMEOUT = 1.0
PROVIDER_FAULTS: dict[str, tuple[Reply, str]] = {
    "429": (Reply.error(429), "rate_limited"),
    "500": (Reply.error(500), "unavailable"),
    "529": (Reply.error(529), "unavailable"),
    "timeout": (Reply.hang(FOREVER), "timeout"),  # only the client's timeout ends it
    "cut stream": (Reply.cut_stream(after_chunks=3, then=Reply.text("half an answer")),
                   "stream_cut"),
}


def provider_settings(data_dir: Path, api: str, base_url: str, **extra: Any) -> Any:
    key = {"anthropic": ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"),
           "openai": ("OPENAI_API_KEY", "OPENAI_BASE_URL")}[api]
    return web_settings(
        data_dir, GATEWAY_PROVIDER=api, GATEWAY_MODEL="fake-model", GATEWAY_STREAM=True,
        GATEWAY_PROVIDER_TIMEOUT=PROVIDER_TIMEOUT, GATEWAY_PROVIDER_RETRIES=0,
        **{key[0]: "sk-test", key[1]: base_url}, **extra,
    )


@pytest.mark.parametrize("fault", list(PROVIDER_FAULTS))
@pytest.mark.parametrize("api", ["anthropic", "openai"])
async def test_provider_fault_ends_with_apology_and_recorded_kind(
    tmp_path: Path, api: str, fault: str
) -> None:
    """A provider fault ends the web turn with the apology in time, its kind logged and counted."""
    reply, kind = PROVIDER_FAULTS[fault]
    async with FakeProviderServer() as srv:
        base_url = srv.anthropic_base_url if api == "anthropic" else srv.openai_base_url
        srv.script(api, reply)  # type: ignore[arg-type]  # api is one of the two names
        async with web_gateway(provider_settings(tmp_path / "data", api, base_url)) as web:
            status, body = await web.chat("c1", "hello")
            samples = await web.metrics_once("gateway_turns_total", 1, channel="web")
            again = await web.chat("c1", "and now?")
            store = web.gateway.store
            assert isinstance(store, JsonlSessionStore)
            log = replay_bytes(store.path_of(WEB_TENANT, body["session"]).read_bytes())
    # Answered at all means in time: a hang lasts until the test is over, and an error or a
    # cut stream is not retried (GATEWAY_PROVIDER_RETRIES=0), so nothing waits long.
    assert (status, body["error"]) == (502, APOLOGY)
    first = log.calls[0]
    outcome = log.outcome_of(first)
    assert first.assistant is None
    assert outcome is not None
    assert outcome.error is not None
    assert outcome.error["kind"] == kind
    assert total(samples, "gateway_provider_calls_total", provider=api, outcome="error") == 1
    assert total(samples, "gateway_turns_total", channel="web", outcome="apologised") == 1
    assert again == (200, {"session": body["session"], "reply": "echo: and now?"})
    assert log.problems == ()
