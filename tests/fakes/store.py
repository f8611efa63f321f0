"""A fault-injecting wrapper at our store seam: real JSONL underneath, failures on demand.

``FaultyStore(inner)`` hands out writers whose appends raise the configured error (an
``OSError`` as a backend would, or ``"hang"`` to never return) while ``store.fault`` is set and
the entry types match ``store.fault_types``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from sessions.jsonl import JsonlSessionStore, JsonlSessionWriter
from sessions.store import MessagePage, SessionInfo, SessionState

Fault = BaseException | str | None


class FaultyWriter:
    def __init__(self, inner: JsonlSessionWriter, store: FaultyStore) -> None:
        self.inner = inner
        self.store = store

    @property
    def session_id(self) -> str:
        return self.inner.session_id

    @property
    def tenant(self) -> str:
        return self.inner.tenant

    @property
    def state(self) -> SessionState:
        return self.inner.state

    async def append(self, entries: Sequence[Mapping[str, Any]]) -> int:
        fault = self.store.fault
        types = {e.get("type") for e in entries}
        if fault is not None and (self.store.fault_types is None or types & self.store.fault_types):
            self.store.faults_raised += 1
            if fault == "hang":
                await asyncio.Event().wait()
            assert isinstance(fault, BaseException)
            raise fault
        return await self.inner.append(entries)

    async def sync(self) -> None:
        await self.inner.sync()

    async def aclose(self) -> None:
        await self.inner.aclose()


class FaultyStore:
    def __init__(self, inner: JsonlSessionStore) -> None:
        self.inner = inner
        self.fault: Fault = None
        self.fault_types: set[str] | None = None
        self.faults_raised = 0

    async def create(self, **kwargs: Any) -> FaultyWriter:
        return FaultyWriter(await self.inner.create(**kwargs), self)

    async def open(self, tenant: str, session_id: str) -> FaultyWriter:
        return FaultyWriter(await self.inner.open(tenant, session_id), self)

    async def exists(self, tenant: str, session_id: str) -> bool:
        return await self.inner.exists(tenant, session_id)

    async def latest_session(self, tenant: str, conversation: str) -> str | None:
        return await self.inner.latest_session(tenant, conversation)

    async def list_sessions(self, tenant: str | None = None) -> list[SessionInfo]:
        return await self.inner.list_sessions(tenant)

    async def read_log(self, tenant: str, session_id: str) -> bytes:
        return await self.inner.read_log(tenant, session_id)

    async def message_page(self, tenant: str, session_id: str, offset: int = 0,
                           limit: int = 50) -> MessagePage:
        return await self.inner.message_page(tenant, session_id, offset, limit)

    async def aclose(self) -> None:
        await self.inner.aclose()
