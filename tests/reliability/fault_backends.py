"""Session stores under test with the means to make their storage fail as real storage fails.

Each backend holds a store and four levers, used by the fault contract suite:

* ``fail(kind)``: from now on the storage fails every write (``ENOSPC``, ``EIO``) or hangs
  (``hang``), until ``recover()``;
* ``crash()``: the process "dies": nothing it had not written yet ever reaches the log; then
  ``restart()`` gives a fresh store over the same storage, as a new process would open it.

The fake is :class:`tests.fakes.store.FaultyStore`; JSONL writes real files through a
:class:`tests.fakes.disk.FaultyDisk`; PostgreSQL fails for real, through a trigger on the
``entries`` table that raises ``disk_full`` (53100) or ``io_error`` (58030), or sleeps.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Protocol

from sessions.jsonl import JsonlSessionStore
from sessions.postgres import schema as pg_schema
from sessions.postgres.store import PostgresSessionStore
from sessions.store import SessionStore
from tests.fakes.disk import FaultyDisk
from tests.fakes.store import FaultyStore
from tests.sessions.pg import PG_URL, connect

ERRORS = {"ENOSPC": OSError(errno.ENOSPC, "No space left on device"),
          "EIO": OSError(errno.EIO, "Input/output error")}
SQLSTATES = {"ENOSPC": "53100", "EIO": "58030"}  # disk_full, io_error
HANG_SECONDS = 1.0
"""How long the PostgreSQL trigger sleeps per row while hanging (longer than the timeouts)."""


class Backend(Protocol):
    name: str
    store: SessionStore

    async def fail(self, kind: str) -> None: ...

    async def recover(self) -> None: ...

    async def crash(self) -> None: ...

    async def restart(self) -> SessionStore: ...

    async def aclose(self) -> None: ...


class FakeBackend:
    name = "fake"

    def __init__(self) -> None:
        self.fake = FaultyStore()
        self.store: SessionStore = self.fake

    async def fail(self, kind: str) -> None:
        self.fake.set_fault("hang" if kind == "hang" else ERRORS[kind])

    async def recover(self) -> None:
        self.fake.set_fault(None)

    async def crash(self) -> None:
        self.fake.crash()

    async def restart(self) -> SessionStore:
        return self.store  # the memory is the "disk": it outlives the dead writers

    async def aclose(self) -> None:
        await self.store.aclose()


class JsonlBackend:
    name = "jsonl"

    def __init__(self, data_dir: Path, stall_after: float) -> None:
        self.data_dir = data_dir
        self.stall_after = stall_after
        self.disk = FaultyDisk()
        self.store: SessionStore = self._open()

    def _open(self) -> JsonlSessionStore:
        return JsonlSessionStore(self.data_dir, durability="turn", ops=self.disk,
                                 stall_after=self.stall_after)

    async def fail(self, kind: str) -> None:
        self.disk.fail("hang" if kind == "hang" else ERRORS[kind])

    async def recover(self) -> None:
        self.disk.recover()

    async def crash(self) -> None:
        self.disk.crash()

    async def restart(self) -> SessionStore:
        self.disk = FaultyDisk()
        self.store = self._open()
        return self.store

    async def aclose(self) -> None:
        self.disk.recover()


class PostgresBackend:
    name = "postgres"

    def __init__(self, schema: str, store: PostgresSessionStore) -> None:
        self.schema = schema
        self.store: SessionStore = store
        self._quoted = pg_schema.quoted(schema)

    @classmethod
    async def connect(cls, schema: str) -> PostgresBackend:
        return cls(schema, await PostgresSessionStore.connect(PG_URL, schema=schema))

    async def _sql(self, statement: str) -> None:
        conn = await connect()
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    async def fail(self, kind: str) -> None:
        q = self._quoted
        body = (f"PERFORM pg_sleep({HANG_SECONDS}); RETURN NEW;" if kind == "hang" else
                f"RAISE EXCEPTION 'storage fault' USING ERRCODE = '{SQLSTATES[kind]}';")
        await self._sql(
            f"CREATE OR REPLACE FUNCTION {q}.fault() RETURNS trigger LANGUAGE plpgsql AS"
            f" $$BEGIN {body} END$$;"
            f" DROP TRIGGER IF EXISTS fault ON {q}.entries;"
            f" CREATE TRIGGER fault BEFORE INSERT ON {q}.entries"
            f" FOR EACH ROW EXECUTE FUNCTION {q}.fault()")

    async def recover(self) -> None:
        await self._sql(f"DROP TRIGGER IF EXISTS fault ON {self._quoted}.entries")

    async def crash(self) -> None:
        # Nothing more may commit for the dead process: its writers' last tries (at close)
        # fail like everything else until the restart.
        await self.fail("EIO")

    async def restart(self) -> SessionStore:
        await self.store.aclose()
        await self.recover()
        self.store = await PostgresSessionStore.connect(PG_URL, schema=self.schema)
        return self.store

    async def aclose(self) -> None:
        await self.recover()
        await self.store.aclose()
