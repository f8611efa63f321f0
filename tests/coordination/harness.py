"""In-process workers for the coordination tests: router, registry and Redis coordinator over
a memory channel, each worker with its own coordinator (own owner id), all sharing one Redis
prefix and one PostgreSQL schema, as separate processes would."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import redis.asyncio as aioredis

from coordination.redis_coordinator import RedisCoordinator
from gateway.agent.loop import AgentLoop
from gateway.agent.recorder import SESSION_LOG
from gateway.agent.tools import ToolRegistry
from gateway.delivery.registry import OPEN_BYTES, ConversationRegistry
from gateway.delivery.router import Router
from gateway.edge.commands import CommandHandler
from gateway.edge.coordination import ConversationQueue, QueueItem, SharedInbox
from gateway.edge.messages import ConversationKey, Inbound, Sender
from gateway.edge.metrics import Metrics
from gateway.edge.provider import Provider
from gateway.persona.tools import persona_tools
from gateway.persona.workspace import PersonaWorkspace
from sessions.postgres.inbox import PostgresInbox
from sessions.postgres.store import PostgresSessionStore
from sessions.replay import Replay, replay_bytes
from sessions.store import SessionStore
from tests.coordination.services import REDIS_URL
from tests.fakes.memory_channel import MemoryChannel
from tests.waiting import until

wait_until = until  # polled waits: see tests/waiting.py


# Redis keeps the time of a lease (its PX ttl) by its own clock. The tests move that clock on by
# shortening what is left of a key's ttl, instead of sleeping until it runs out: nothing then
# depends on how fast a busy machine gets there.

async def lapse(redis: aioredis.Redis, key: str) -> None:
    """``key``'s ttl runs out now (as if its holder had been silent past it): returns once the
    key is gone or another holder has taken it (one campaigning in this process may take it
    between two looks, so "gone" alone can be missed for good: a loaded run waited 60 s)."""
    holder = await redis.get(key)
    assert holder is not None, f"{key} is not there to lapse"
    assert await redis.pexpire(key, 1), f"{key} is not there to lapse"
    await until(lambda: not_held_by(redis, key, holder), what=f"{key} to lapse")


async def renewal_seen(redis: aioredis.Redis, key: str, ttl: float) -> str | None:
    """Halve what is left of ``key``'s ttl, then wait until its holder's renewal puts it back
    above that: the renewal happened (the key would otherwise lapse). Returns its holder."""
    half = int(ttl * 1000 / 2)
    assert await redis.pexpire(key, half), f"{key} is not there to renew"
    await until(lambda: pttl_above(redis, key, half), what=f"{key} renewed")
    holder = await redis.get(key)
    return holder.decode() if isinstance(holder, bytes) else holder


async def not_held_by(redis: aioredis.Redis, key: str, holder: bytes | str) -> bool:
    """The key is gone, or holds another value than ``holder`` (in these tests a new holding
    never has the lapsed one's value: a lease's value names its claim, and the leader whose
    key lapses is dead)."""
    return bool(await redis.get(key) != holder)


async def pttl_above(redis: aioredis.Redis, key: str, ms: int) -> bool:
    return bool(await redis.pttl(key) > ms)


def item(chat: str, text: str, *, channel: str = "memory") -> QueueItem:
    return QueueItem(Inbound(ConversationKey(channel, chat), Sender("u"), text))


class NoInbox:
    """The inbox of a coordinator used only for pairing or elections: never asked."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the inbox was not expected to be used ({name})")


def inbox_of(store: SessionStore | None) -> SharedInbox:
    if store is None:
        return cast(SharedInbox, NoInbox())
    assert isinstance(store, PostgresSessionStore), "workers share a PostgreSQL store"
    return PostgresInbox(store)


@asynccontextmanager
async def coordinator(prefix: str, store: SessionStore | None = None,
                      ttl: float = 1.0) -> AsyncIterator[RedisCoordinator]:
    """A coordinator; with a PostgreSQL ``store``, over its inbox (queues need one)."""
    async with RedisCoordinator(REDIS_URL, inbox_of(store), prefix=prefix,
                                lease_ttl=ttl) as running:
        yield running


@dataclass
class Worker:
    coordinator: RedisCoordinator
    router: Router
    registry: ConversationRegistry
    channel: MemoryChannel


@asynccontextmanager
async def worker(prefix: str, store: SessionStore, provider: Provider, persona: Path, *,
                 ttl: float = 1.0, sessions: SessionStore | None = None,
                 handlers: Callable[[ConversationRegistry], Mapping[str, CommandHandler]]
                 | None = None,
                 queue: Callable[[ConversationQueue], ConversationQueue] | None = None,
                 linger: float = 0.0, open_bytes: int = OPEN_BYTES) -> AsyncIterator[Worker]:
    """One gateway worker without HTTP: deliveries through ``worker.channel.say``.

    ``sessions``: the store its registry opens sessions in (default ``store``, whose inbox
    the coordinator uses); ``handlers``: chat-command handlers, made from its registry;
    ``queue``: wraps the coordinator's queue (a test's hook at that seam); ``linger``: how
    long a lease is kept for a conversation's next message; ``open_bytes``: the registry's
    memory bound for open conversations (default: the gateway's)."""
    metrics = Metrics()
    workspace = PersonaWorkspace(persona)
    loop = AgentLoop(provider=provider, prompts=workspace,
                     tools=ToolRegistry(persona_tools(workspace)),
                     recorder=SESSION_LOG, metrics=metrics)
    registry = ConversationRegistry(sessions or store, metrics, max_bytes=open_bytes)
    channel = MemoryChannel()
    async with RedisCoordinator(REDIS_URL, inbox_of(store), prefix=prefix,
                                lease_ttl=ttl, linger=linger) as coord:
        conversations: ConversationQueue = coord.conversations
        router = Router(registry=registry, loop=loop, sink_for=channel.reply_sink,
                        metrics=metrics,
                        conversations=queue(conversations) if queue is not None
                        else conversations,
                        handlers=handlers(registry) if handlers is not None else None)
        async with router:
            await channel.start(router.deliver)
            try:
                yield Worker(coord, router, registry, channel)
            finally:
                await router.drain(5)
        await registry.aclose()


async def log_of(store: SessionStore, chat: str, channel: str = "memory") -> Replay:
    """The replay of the conversation's latest session."""
    session = await store.latest_session("default", f"{channel}:{chat}")
    assert session is not None, f"no session for {chat}"
    return replay_bytes(await store.read_log("default", session))


def transcript(replay: Replay) -> list[tuple[str, str]]:
    """(role, text) of every message in log order (tool blocks as their type)."""
    out = []
    for message in replay.messages:
        content = message["content"]
        if isinstance(content, str):
            out.append((message["role"], content))
        else:
            out.append((message["role"], " ".join(
                str(b.get("text", b.get("type"))) for b in content)))
    return out
