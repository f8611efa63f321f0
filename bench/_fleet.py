"""Shared parts of the benchmarks of several workers: private servers, a counting proxy, the
workers themselves and what the servers say they did.

* :class:`BenchPostgres`: a PostgreSQL cluster of the benchmark's own (``initdb`` in a
  temporary directory, the outage trials' :class:`PrivatePostgres`) with
  ``pg_stat_statements`` loaded, so every statement the workers sent is counted; ``fsync`` on
  or off (on: a commit waits for the disk, as in production).
* :class:`BenchRedis`: ``redis-server --save ''`` on a free port.
* :class:`CountingProxy`: a TCP proxy between the workers and a server that counts *round
  trips*: a client's bytes that follow the server's answer (or open the connection) start a
  new one. Protocol-blind, so it counts what the wire carried: asyncpg's pipelined
  Bind/Execute/Sync is one, a pool's reset query is one, a Redis pipeline is one.
* :func:`pg_counts` / :func:`redis_counts`: write transactions (transaction ids handed out:
  every transaction that wrote, so every commit that waits for the disk), statements by text
  (``pg_stat_statements``), Redis commands by name (``INFO commandstats``).

Workers are real ``python -m gateway run`` processes (:func:`tests.coordination.cluster.
start_workers`); ``tree`` runs another checkout's code (``PYTHONPATH``), to measure a
commit before and after a change with the same script.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg
import psutil
import redis.asyncio as aioredis

from sessions.postgres import schema as pg_schema
from tests.coordination.private_services import PrivatePostgres, PrivateRedis

ROOT = Path(__file__).resolve().parents[1]


class BenchPostgres(PrivatePostgres):
    """A private cluster with ``pg_stat_statements`` (see the module docstring)."""

    def __init__(self, *, fsync: bool = True, max_connections: int = 200) -> None:
        super().__init__()
        self.fsync = fsync
        self.max_connections = max_connections

    def _start_args(self) -> list[str]:
        durable = "" if self.fsync else (" -c fsync=off -c synchronous_commit=off"
                                         " -c full_page_writes=off")
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
                   f" -c max_connections={self.max_connections}"
                   " -c shared_preload_libraries=pg_stat_statements"
                   " -c pg_stat_statements.track=top -c pg_stat_statements.track_utility=on"
                   " -c pg_stat_statements.max=5000" + durable)
        return [self._pg_ctl, "-D", str(self.data), "-l", str(self.logfile), "-w",
                "-t", "90", "-o", options, "start"]

    def pid(self) -> int:
        """The postmaster's pid (its children are the server's processes)."""
        return int((self.data / "postmaster.pid").read_text().split()[0])

    async def prepare(self, schema: str, tree: Path | None = None) -> None:
        """The session tables in ``schema`` and the statistics extension; with ``tree``, the
        tables of that checkout's schema version (a store refuses a newer schema than its own)."""
        conn = await asyncpg.connect(self.url)
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            if tree is None:
                await pg_schema.upgrade(conn, schema)
        finally:
            await conn.close()
        if tree is not None:
            script = ("import asyncio, asyncpg, sys\n"
                      "from sessions.postgres import schema\n"
                      "async def main():\n"
                      "    conn = await asyncpg.connect(sys.argv[1])\n"
                      "    await schema.upgrade(conn, sys.argv[2])\n"
                      "    await conn.close()\n"
                      "asyncio.run(main())\n")
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", script, self.url, schema,
                env={**os.environ, **tree_env(tree)}, cwd=tree)
            if await asyncio.wait_for(proc.wait(), 120) != 0:
                raise RuntimeError(f"the schema of {tree} could not be created")


class BenchRedis(PrivateRedis):
    """A private ``redis-server`` without persistence."""

    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


@dataclass
class Wire:
    """What a proxy saw: round trips, bytes each way, connections opened."""

    round_trips: int = 0
    up: int = 0
    down: int = 0
    connections: int = 0

    def minus(self, other: Wire) -> Wire:
        return Wire(self.round_trips - other.round_trips, self.up - other.up,
                    self.down - other.down, self.connections - other.connections)


class CountingProxy:
    """A TCP proxy on a free loopback port to ``127.0.0.1:<target>`` (see the module doc)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.wire = Wire()
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> CountingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(Exception):
            await self._server.wait_closed()

    def snapshot(self) -> Wire:
        return Wire(self.wire.round_trips, self.wire.up, self.wire.down, self.wire.connections)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.wire.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            self._tasks.discard(task)
            return
        turn = ["s"]  # who spoke last: the next client bytes after the server's start a trip

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, side: str) -> None:
            try:
                while data := await src.read(65536):
                    if side == "c":
                        self.wire.up += len(data)
                        if turn[0] != "c":
                            self.wire.round_trips += 1
                    else:
                        self.wire.down += len(data)
                    turn[0] = side
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    dst.close()

        try:
            await asyncio.gather(pump(reader, up_writer, "c"), pump(up_reader, writer, "s"))
        finally:
            self._tasks.discard(task)


@dataclass
class PgCounts:
    """Write transactions so far and statement executions by text."""

    xids: int
    statements: Counter[str] = field(default_factory=Counter)

    def minus(self, other: PgCounts) -> PgCounts:
        diff = Counter(self.statements)
        diff.subtract(other.statements)
        return PgCounts(self.xids - other.xids, Counter({k: v for k, v in diff.items() if v}))


async def pg_counts(url: str) -> PgCounts:
    """Transaction ids handed out so far (the next one to be given; this read takes none) and
    ``pg_stat_statements``' calls by statement text (this connection's own are left out)."""
    conn = await asyncpg.connect(url)
    try:
        xmax = await conn.fetchval("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
        rows = await conn.fetch("SELECT query, sum(calls)::bigint AS calls"
                                " FROM pg_stat_statements GROUP BY query")
    finally:
        await conn.close()
    return PgCounts(int(xmax), Counter({str(r["query"]): int(r["calls"]) for r in rows
                                        if "pg_stat_statements" not in r["query"]
                                        and "pg_current_snapshot" not in r["query"]}))


async def redis_counts(url: str) -> Counter[str]:
    """Commands processed so far, by name (``INFO commandstats``; ``INFO`` itself left out)."""
    client = aioredis.Redis.from_url(url)
    try:
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    out: Counter[str] = Counter()
    for name, value in stats.items():
        command = str(name).removeprefix("cmdstat_")
        if command != "info":
            out[command] = int(value["calls"])
    return out


def counter_minus(after: Counter[str], before: Counter[str]) -> Counter[str]:
    diff = Counter(after)
    diff.subtract(before)
    return Counter({k: v for k, v in diff.items() if v})


def process_tree_cpu(pid: int) -> float:
    """User + system CPU seconds of a process and its children (a server's backends)."""
    total = 0.0
    try:
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                total += times.user + times.system
    except psutil.Error:
        pass
    return total


def tree_env(tree: Path | None) -> dict[str, str]:
    """Environment that makes workers run ``tree``'s code instead of this checkout's."""
    return {} if tree is None else {"PYTHONPATH": str(tree.resolve())}


def describe_tree(tree: Path | None) -> str:
    """The commit whose code the workers run, for reports: a tree made by ``git archive``
    names it in a ``COMMIT`` file; this checkout says its HEAD, ``+changes`` when dirty."""
    if tree is not None:
        marker = tree / "COMMIT"
        return marker.read_text().strip() if marker.exists() else str(tree)
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              check=True, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain",
                                "--untracked-files=no"],
                               check=True, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}+changes" if dirty else head


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} / {five:.1f} / {fifteen:.1f}"
