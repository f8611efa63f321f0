"""An erasure as an operation of the running system (``gateway forget``, ``/forget``).

:meth:`ErasureService.erase` first holds the person's channel still wherever conversations are
served: in this process (its :class:`~gateway.edge.erasure.Holder`, the router's pauses) and
in every other worker (the :class:`~gateway.edge.erasure.ErasureBus`), each waiting until no
turn runs there and confirming. As they let go, the other workers also empty their own stderr
logs of the MCP servers the person's sessions called, and the report lists what they emptied
(``mcp-log <worker>:<file>``). Only then is anything read for the plan or deleted
(:class:`gateway.erasure.eraser.Eraser`); the copies of the changed sessions are dropped
everywhere before the hold ends, so the person's next message starts a fresh conversation
that carries nothing of what was erased. If the hold cannot be had (a turn stays busy, a
worker does not confirm) or the store refuses (a log is open in another process), nothing is
changed and :class:`~gateway.edge.erasure.ErasureRefusedError` says why.

``gateway forget`` reaches this service in the running gateway through its control socket
(:mod:`app.control`); with no gateway running it runs one of its own, with no holder.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

from gateway.edge.erasure import ErasureBus, ErasureRefusedError, Hold, Holder
from gateway.edge.messages import ConversationKey
from gateway.edge.scopes import Scope
from gateway.erasure.eraser import Eraser, ErasurePlan, ErasureReport, Removal
from sessions.errors import SessionLockedError

HOLD_TIMEOUT = 30.0
"""Seconds an erasure waits for the conversations it holds to finish their turns, and for
the other workers to confirm, before it gives up, having changed nothing."""


class ErasureService:
    """See the module docstring."""

    def __init__(self, eraser: Eraser, holder: Holder | None = None,
                 bus: ErasureBus | None = None, *, timeout: float = HOLD_TIMEOUT,
                 mcp_servers: Callable[[ErasurePlan], Awaitable[set[str]]] | None = None,
                 ) -> None:
        """``mcp_servers``: the MCP servers whose stderr logs the other workers empty of
        their own (:class:`~gateway.erasure.steps.McpLogStep`)."""
        self.eraser = eraser
        self.holder = holder
        self.bus = bus
        self.timeout = timeout
        self.mcp_servers = mcp_servers

    async def preview(self, scope: Scope) -> tuple[ErasurePlan, list[Removal]]:
        """What an erasure would remove now (reads only; ``--dry-run``, ``/forget``)."""
        plan = await self.eraser.plan(scope)
        found = [r for removals in await self.eraser.find(plan) for r in removals]
        return plan, found

    async def erase(self, scope: Scope, *, requested_by: str,
                    exempt: ConversationKey | None = None) -> ErasureReport:
        """Hold, erase, drop the copies, let go (see the module docstring). ``exempt``: the
        conversation serving this erasure (``/forget``), which is not waited for."""
        hold = Hold(scope.tenant, scope.channel, exempt)
        async with AsyncExitStack() as stack:
            if self.holder is not None:
                await stack.enter_async_context(self.holder.holding(hold, self.timeout))
            changed = (await stack.enter_async_context(self.bus.others(hold, self.timeout))
                       if self.bus is not None else None)
            plan = await self.eraser.plan(scope)
            if self.holder is not None:
                await self.holder.drop(plan.touched)  # so no open writer holds them
            if changed is not None:
                changed.sessions.update(plan.touched)
                if self.mcp_servers is not None:  # read before the erasure deletes them
                    changed.mcp_servers.update(await self.mcp_servers(plan))
            try:
                report = await self.eraser.erase(scope, requested_by=requested_by, plan=plan)
            except SessionLockedError as exc:
                raise ErasureRefusedError(f"{exc}: another process has it open") from exc
            if self.holder is not None:  # opened again meanwhile by nothing; to be sure
                await self.holder.drop(plan.touched)
        if changed is None or not changed.elsewhere:
            return report
        # What the other workers emptied of their own as they let go (the bus's exit).
        elsewhere = tuple(Removal(*line.split(" ", 1)) for line in changed.elsewhere)
        return ErasureReport(report.scope, report.removed, elsewhere)
