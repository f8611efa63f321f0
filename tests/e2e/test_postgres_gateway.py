"""Model-visible ⟺ recorded with the PostgreSQL store: the agent loop, router and registry
over a memory channel; every body the provider received equals its replay from the database,
and a conversation resumes its session after the gateway restarts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sessions.postgres.store import PostgresSessionStore
from sessions.replay import Replay
from tests.e2e.replaying import assert_replay_shows_what_was_read
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.harness import running_core
from tests.sessions.pg import PG_URL, fresh_schema

pytestmark = pytest.mark.services


def tool_use(name: str, args: dict[str, Any], id_: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [
        {"type": "text", "text": "one moment"},
        {"type": "tool_use", "id": id_, "name": name, "input": args},
    ]}


def requests(replay: Replay) -> list[dict[str, Any]]:
    return [replay.request(turn, "anthropic") for turn in replay.calls]


async def test_every_call_replays_from_the_database(tmp_path: Path) -> None:
    """A tool round, a rebuilt prompt and a restart: each call replays to the body sent."""
    provider = ScriptedProvider()
    provider.script("hello!", tool_use("memory_write", {"text": "likes tea"}, "t1"), "noted",
                    "still here")
    async with fresh_schema() as schema:
        store = await PostgresSessionStore.connect(PG_URL, schema=schema)
        try:
            async with running_core(store, provider, tmp_path / "p") as core:
                first = await core.channel.say("c1", "hi")
                assert first is not None
                assert first.session_id is not None
                await core.channel.wait_replies(1)
                await core.channel.say("c1", "remember that I like tea")
                await core.channel.wait_replies(2)
            # A new gateway over the same database resumes the conversation's session.
            async with running_core(store, provider, tmp_path / "p") as core:
                again = await core.channel.say("c1", "are you there?")
                assert again is not None
                await core.channel.wait_replies(1)
                replay = await core.replay(first.session_id)
        finally:
            await store.aclose()
    assert again.session_id == first.session_id
    assert (replay.problems, len(replay.calls)) == ((), 4)
    assert requests(replay) == provider.bodies
    assert assert_replay_shows_what_was_read(replay, provider.bodies) == 4
    assert [p.reason for p in replay.prompts] == ["initial", "rebuilt:memory_write"]


async def test_attachments_live_beside_the_sessions_in_the_database(tmp_path: Path) -> None:
    """With the PostgreSQL store the composition root keeps blobs in its ``blobs`` table; a
    photo's call replays from the database alone (after the gateway restarted)."""
    from app.compose_store import blob_store_for
    from gateway.edge.messages import Attachment
    from sessions.blobs import load
    from sessions.postgres.blobs import PostgresBlobStore
    from tests.fakes import media

    photo = media.jpeg(50, 40)
    provider = ScriptedProvider()
    async with fresh_schema() as schema:
        store = await PostgresSessionStore.connect(PG_URL, schema=schema)
        try:
            blobs = blob_store_for(store, tmp_path / "unused")
            assert isinstance(blobs, PostgresBlobStore)
            async with running_core(store, provider, tmp_path / "p", blobs=blobs,
                                    prompt_cache=False) as core:
                accepted = await core.channel.say(
                    "c1", "what is this?", attachments=(Attachment("a.jpg", "image/jpeg", photo),))
                assert accepted is not None
                assert accepted.session_id is not None
                await core.channel.wait_replies(1)
            async with running_core(store, provider, tmp_path / "p", blobs=blobs) as core:
                replay = await core.replay(accepted.session_id)
            turn = replay.call(1)
            found = await load(PostgresBlobStore(store), "default", replay.attachments(turn))
        finally:
            await store.aclose()
    assert replay.request(turn, "anthropic", found) == provider.bodies[0]
    assert assert_replay_shows_what_was_read(replay, provider.bodies, found) == 1
    assert not (tmp_path / "unused").exists()  # nothing went to files
