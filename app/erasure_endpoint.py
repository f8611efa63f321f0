"""The running gateway's side of erasure: its control socket (``gateway forget`` hands the
erasure to it) and, with several workers, its answers to the other workers' holds.

Entered as one of the gateway's services (after the router, so its pauses exist), left before
the router closes. Requests and answers: :mod:`app.control`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from app.control import ControlServer
from gateway.edge.erasure import ErasureBus, ErasureRefusedError, Holder, OwnErasure
from gateway.edge.scopes import ScopeError, parse_ref
from gateway.edge.tasks import stop
from gateway.erasure.eraser import ErasureReport, Removal
from gateway.erasure.service import ErasureService
from sessions.errors import SessionError
from sessions.names import DEFAULT_TENANT


class ErasureEndpoint:
    """See the module docstring. ``holder`` is the router's pauses."""

    def __init__(self, service: ErasureService, data_dir: Path,
                 bus: ErasureBus | None = None, *, holder: Holder | None = None,
                 own: OwnErasure | None = None) -> None:
        """``own``: what this worker erases of its own for another's erasure (its MCP
        logs)."""
        self.service = service
        self.bus = bus
        self.holder = holder
        self.own = own
        self._control = ControlServer(data_dir, self.handle)
        self._serving: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ErasureEndpoint:
        if self.bus is not None and self.holder is not None:
            started = asyncio.Event()
            self._serving = asyncio.get_running_loop().create_task(
                self.bus.serve(self.holder, started, self.own), name="erasure-bus")
            waiting = asyncio.ensure_future(started.wait())
            await asyncio.wait([waiting, self._serving], return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            if self._serving.done():  # could not subscribe: the gateway cannot start
                self._serving.result()
        await self._control.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self._control.__aexit__(None, None, None)
        finally:
            serving, self._serving = self._serving, None
            if serving is not None:
                await stop(serving)

    async def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """One control request (``{"op": "forget", ...}``) -> its answer."""
        if request.get("op") != "forget":
            return {"ok": False, "error": f"unknown op {request.get('op')!r}"}
        return await run_forget(self.service, request)


async def run_forget(service: ErasureService, request: dict[str, Any]) -> dict[str, Any]:
    """Erase (or, with ``dry_run``, preview) the person a request names; the answer lists
    what was (would be) removed, or says why nothing was."""
    elsewhere: list[Removal] = []
    try:
        scope = parse_ref(str(request.get("user")), "person",
                          str(request.get("tenant") or DEFAULT_TENANT))
    except ScopeError as exc:
        return {"ok": False, "error": str(exc)}
    try:
        if request.get("dry_run"):
            plan, found = await service.preview(scope)
            removed = ([Removal("session", sid) for sid in plan.sessions]
                       + [Removal("message", f"{sid}#{seq}")
                          for sid, lines in sorted(plan.rewrites.items())
                          for seq in sorted(lines)] + found)
        else:
            report: ErasureReport = await service.erase(
                scope, requested_by=str(request.get("requested_by") or "operator"))
            removed = list(report.removed)
            elsewhere = list(report.elsewhere)
    except ErasureRefusedError as exc:
        return {"ok": False, "error": str(exc)}
    except (SessionError, OSError) as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, "removed": [[r.kind, r.name] for r in removed],
            "elsewhere": [[r.kind, r.name] for r in elsewhere]}

