"""A gateway core (registry, loop, router) over a memory channel, for tests of the loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from coordination.local import LocalConversations
from gateway.agent.call import BeforeCallHook
from gateway.agent.compaction import CompactionSettings
from gateway.agent.loop import AgentLoop, LoopSettings
from gateway.agent.recorder import SESSION_LOG
from gateway.agent.tools import ToolRegistry
from gateway.delivery.registry import ConversationRegistry
from gateway.delivery.router import Router
from gateway.delivery.serving import RETRY_DELAY
from gateway.edge.commands import USAGE
from gateway.edge.ledger import UsageLedger
from gateway.edge.metrics import Metrics
from gateway.edge.observe import NO_OBSERVER, TurnObserver
from gateway.edge.provider import Provider
from gateway.media.images import IMAGE_LIMITS
from gateway.media.intake import FetchFile, MediaIntake
from gateway.media.policy import MediaLimits
from gateway.media.transcribe import Transcriber
from gateway.persona.tools import persona_tools
from gateway.persona.workspace import PersonaWorkspace
from gateway.usage.accounting import Accounting
from gateway.usage.command import UsageCommand
from gateway.usage.limits import Limits, LimitSettings
from sessions.blobs import BlobStore
from sessions.replay import Replay, replay_bytes
from sessions.store import SessionStore
from tests.fakes.memory_channel import MemoryChannel
from tests.waiting import WAIT


@dataclass
class Core:
    channel: MemoryChannel
    router: Router
    registry: ConversationRegistry
    metrics: Metrics
    store: SessionStore
    workspace: PersonaWorkspace

    async def idle(self, timeout: float = WAIT) -> None:  # noqa: ASYNC109
        """Wait until no conversation has a worker task (all turns done)."""
        async with asyncio.timeout(timeout):
            await self.router.idle()

    async def replay(self, session_id: str, tenant: str = "default") -> Replay:
        return replay_bytes(await self.store.read_log(tenant, session_id))


@asynccontextmanager
async def running_core(
    store: SessionStore,
    provider: Provider,
    persona_dir: Path,
    *,
    window_tokens: int = 16_000,
    persist_timeout: float = 2.0,
    hooks: Sequence[BeforeCallHook] = (),
    max_iterations: int = 8,
    observer: TurnObserver = NO_OBSERVER,
    prompt_cache: bool = True,
    blobs: BlobStore | None = None,
    transcriber: Transcriber | None = None,
    limits: MediaLimits | None = None,
    conversations: LocalConversations | None = None,
    compaction: bool = True,
    fallbacks: Sequence[Provider] = (),
    ledger: UsageLedger | None = None,
    budgets: LimitSettings | None = None,
    fetch: FetchFile | None = None,
    clock: Callable[[], float] = time.time,
    max_concurrent_turns: int | None = 32,
    max_concurrent_downloads: int = 16,
    retry_delay: float = RETRY_DELAY,
    channel: MemoryChannel | None = None,
) -> AsyncIterator[Core]:
    """The core over a memory channel; with ``blobs``, attachments are taken in (the intake in
    front of the router, and the router's ``take_in`` for files with a ``ref``, which ``fetch``
    downloads) and expanded at send time. ``conversations``: a queue over an owed journal on
    disk (opened and closed here), for tests across restarts; by default one in memory.
    ``clock``: the wall clock of the registry (the time a turn starts at, which budgets and
    rate limits read), the accounting and ``/usage`` (which UTC day a call counts for).
    ``channel``: a given memory channel (one that places its replies, say, or one whose
    platform messages a restart must find again)."""
    metrics = Metrics()
    workspace = PersonaWorkspace(persona_dir)
    loop = AgentLoop(
        provider=provider, prompts=workspace, tools=ToolRegistry(persona_tools(workspace)),
        recorder=SESSION_LOG, hooks=hooks, metrics=metrics,
        settings=LoopSettings(window_tokens=window_tokens, max_iterations=max_iterations,
                              prompt_cache=prompt_cache,
                              compaction=CompactionSettings(enabled=compaction)),
        fallbacks=fallbacks,
        accounting=Accounting(metrics, ledger=ledger, clock=clock),
        limits=Limits(budgets, ledger) if budgets is not None and ledger is not None else None,
        observer=observer,
        blobs=blobs,
    )
    registry = ConversationRegistry(store, metrics, persist_timeout=persist_timeout, clock=clock)
    channel = channel if channel is not None else MemoryChannel()
    queue = conversations if conversations is not None else LocalConversations()
    await queue.open()
    handlers = ({USAGE.name: UsageCommand(ledger, budgets or LimitSettings(), clock).run}
                if ledger is not None else None)
    intake = (MediaIntake(blobs, limits=limits or MediaLimits(),
                          images=IMAGE_LIMITS[provider.shape], transcriber=transcriber,
                          fetch=fetch)
              if blobs is not None else None)
    router = Router(registry=registry, loop=loop, sink_for=channel.reply_sink, metrics=metrics,
                    conversations=queue, handlers=handlers,
                    max_concurrent_turns=max_concurrent_turns,
                    max_concurrent_downloads=max_concurrent_downloads, retry_delay=retry_delay,
                    take_in=intake.prepare if intake is not None else None)
    deliver = router.deliver
    if intake is not None:
        deliver = intake.wrap(router.deliver)  # type: ignore[assignment]
    try:
        async with router:
            await channel.start(deliver)
            try:
                yield Core(channel, router, registry, metrics, store, workspace)
            finally:
                await router.drain(5)
        await registry.aclose()
    finally:
        await queue.aclose()
