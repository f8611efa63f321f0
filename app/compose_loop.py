"""The composition root, agent-turn half: the loop a turn runs and what it is given.

The persona workspace (prompts and persona tools), the tool registry (persona, schedule and
file tools, the MCP toolbox, the media keeper), the provider with its fallbacks, accounting
and limits, put together as one :class:`~gateway.agent.loop.AgentLoop`. Kept apart from
:mod:`app.compose` because tests build a loop alone, and the turn's wiring reads in one place.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.compose_media import build_keeper
from app.compose_tools import build_toolbox
from app.compose_usage import limit_settings
from app.config import Settings
from app.prices import load_prices
from gateway.agent.call import BeforeCallHook
from gateway.agent.compaction import CompactionSettings
from gateway.agent.loop import AgentLoop, LoopSettings
from gateway.agent.prompt import PromptSource
from gateway.agent.recorder import SESSION_LOG
from gateway.agent.tools import ToolRegistry
from gateway.edge.ledger import UsageLedger
from gateway.edge.metrics import Metrics
from gateway.edge.observe import NO_OBSERVER, TurnObserver
from gateway.edge.provider import Provider
from gateway.edge.tools import Tool
from gateway.media.send_file import SendFileTool
from gateway.persona.tools import persona_tools
from gateway.persona.workspace import PersonaWorkspace
from gateway.usage.accounting import Accounting
from gateway.usage.limits import Limits
from sessions.blobs import BlobStore


def build_persona(settings: Settings) -> PersonaWorkspace:
    """The persona workspace (operator, tenant and memory-scope layers)."""
    return PersonaWorkspace(settings.persona_root, self_edit=settings.persona_self_edit,
                            rescan_after=settings.persona_rescan)


def build_loop(
    settings: Settings,
    provider: Provider,
    metrics: Metrics,
    *,
    prompts: PromptSource | None = None,
    tools: ToolRegistry | None = None,
    hooks: Sequence[BeforeCallHook] = (),
    observer: TurnObserver = NO_OBSERVER,
    blobs: BlobStore | None = None,
    workspace: PersonaWorkspace | None = None,
    fallbacks: Sequence[Provider] = (),
    ledger: UsageLedger | None = None,
    extra_tools: Sequence[Tool] = (),
) -> AgentLoop:
    if prompts is None or tools is None:
        workspace = workspace or build_persona(settings)
        prompts = prompts or workspace
        extra = [*([SendFileTool(blobs)] if blobs is not None else []), *extra_tools]
        if tools is None:
            toolbox = build_toolbox(settings)
            tools = ToolRegistry([*persona_tools(workspace), *extra],
                                 sources=[toolbox] if toolbox is not None else [],
                                 keeper=(build_keeper(settings, provider, blobs)
                                         if blobs is not None else None))
    return AgentLoop(
        provider=provider, prompts=prompts, tools=tools, recorder=SESSION_LOG, hooks=hooks,
        metrics=metrics,
        settings=LoopSettings(max_iterations=settings.max_iterations,
                              window_tokens=settings.window_tokens,
                              prompt_cache=settings.prompt_cache,
                              compaction=CompactionSettings(enabled=settings.compaction)),
        observer=observer,
        accounting=Accounting(metrics, load_prices(settings.prices_file), ledger),
        blobs=blobs,
        fallbacks=fallbacks,
        limits=(Limits(limit_settings(settings), ledger)
                if ledger is not None and limit_settings(settings).any else None),
    )
