"""The providers' credentials, checked once as the gateway starts (``gateway run``, ``gateway
chat``), so a wrong key is one line at start, not "I couldn't reach my language model" at the
first message.

Each provider that can (:class:`gateway.edge.provider.CheckedProvider`: the SDK providers; the
offline one makes no request) lists its models once, the configured one and each of
``GATEWAY_FALLBACKS``. Two answers stop the start with one line naming the setting and what the
provider said, exit 2:

* the key was refused (401/403): ``ANTHROPIC_API_KEY was refused (anthropic: HTTP 401
  authentication_error: invalid x-api-key)``;
* no answer (cannot connect, timeout): ``anthropic cannot be reached at https://...
  (ANTHROPIC_BASE_URL): ...``.

Any other answer (a compatible server without a models list answers 404) proves nothing either
way: one warning, and the gateway starts. With ``GATEWAY_START_OFFLINE_OK=1`` the two stopping
answers are a warning too, the gateway starts degraded, and ``/healthz`` says why (503, the
``provider_check`` part's ``last_error``) until a check every :data:`RECHECK` seconds passes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from gateway.edge.errors import ConfigError, ProviderError
from gateway.edge.provider import CheckedProvider, Provider

if TYPE_CHECKING:
    from app.server import Gateway

log = logging.getLogger(__name__)

RECHECK = 30.0
"""Seconds between checks while the gateway runs degraded (``GATEWAY_START_OFFLINE_OK``)."""

VARIABLES = {"anthropic": ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"),
             "openai": ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
"""The key and base URL settings of each provider, named in the one line."""

HINT = "; GATEWAY_START_OFFLINE_OK=1 starts anyway, degraded"


@dataclass(frozen=True, slots=True)
class Checked:
    """One provider to check; ``fallback``: it is one of ``GATEWAY_FALLBACKS``."""

    provider: CheckedProvider
    fallback: bool = False


def describe(checked: Checked, exc: ProviderError) -> tuple[bool, str]:
    """(whether it stops the start, the line) for a failed check."""
    name = checked.provider.name
    key, url = VARIABLES.get(name, (f"the {name} key", f"the {name} URL"))
    prefix = "GATEWAY_FALLBACKS: " if checked.fallback else ""
    if exc.status in (401, 403):
        return True, f"{prefix}{key} was refused ({exc})"
    if exc.status is None:
        endpoint = getattr(checked.provider, "endpoint", None) or "its default URL"
        return True, f"{prefix}{name} cannot be reached at {endpoint} ({url}): {exc}"
    return False, f"{prefix}{name} answered the credential check with an error ({exc})"


class ProviderCheck:
    """A part of the gateway's lifespan: entered before the HTTP server listens, it checks
    every provider once; see the module docstring. :meth:`health` is the ``provider_check``
    part of ``/healthz``."""

    def __init__(self, providers: Sequence[Checked], *, offline_ok: bool,
                 recheck: float = RECHECK) -> None:
        self.providers = list(providers)
        self.offline_ok = offline_ok
        self.recheck = recheck
        self._problems: list[str] = []
        self._group: asyncio.TaskGroup | None = None
        self._again: asyncio.Task[None] | None = None

    async def run(self) -> list[str]:
        """Check every provider now; returns the lines of those that stop a start (and logs
        a warning for each answer that proves nothing)."""
        problems = []
        for checked in self.providers:
            try:
                await checked.provider.check()
            except ProviderError as exc:
                stops, line = describe(checked, exc)
                if stops:
                    problems.append(line)
                else:
                    log.warning("%s; starting without it", line)
        self._problems = problems
        return problems

    def health(self) -> dict[str, Any]:
        return {"ok": not self._problems,
                "last_error": "; ".join(self._problems) if self._problems else None}

    async def __aenter__(self) -> Self:
        problems = await self.run()
        if problems and not self.offline_ok:
            raise ConfigError(problems[0] + HINT)
        if problems:
            log.warning("starting degraded (GATEWAY_START_OFFLINE_OK): %s", "; ".join(problems))
            self._group = asyncio.TaskGroup()
            await self._group.__aenter__()
            self._again = self._group.create_task(self._until_passed())
        return self

    async def _until_passed(self) -> None:
        while self._problems:
            await asyncio.sleep(self.recheck)
            if not await self.run():
                log.info("provider check passed: no longer degraded")

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        group, self._group = self._group, None
        if group is None:
            return
        if self._again is not None:
            self._again.cancel()  # a cancelled child ends the group quietly
        await group.__aexit__(None, None, None)


def providers_to_check(provider: Provider, fallbacks: Sequence[Provider]) -> list[Checked]:
    """The configured provider and the fallbacks, those that can be checked."""
    return [Checked(p, fallback=i > 0) for i, p in enumerate([provider, *fallbacks])
            if isinstance(p, CheckedProvider)]


def check_at_start(gateway: Gateway, fallbacks: Sequence[Provider], *,
                   offline_ok: bool) -> ProviderCheck:
    """Make ``gateway`` check its providers as it starts, and report the check on
    ``/healthz``: the first part to start, right after those open since they were built (the
    clients, the store), so a refused key stops the start before Redis, the router or the
    tool servers are touched, and a failed start still closes every client."""
    from app.server import started

    check = ProviderCheck(providers_to_check(gateway.provider, fallbacks), offline_ok=offline_ok)
    at = next((i for i, part in enumerate(gateway.parts) if not part.opened), len(gateway.parts))
    gateway.parts.insert(at, started("provider check", check))
    gateway.health_parts["provider_check"] = check.health
    return check
