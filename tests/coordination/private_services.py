"""A PostgreSQL cluster and a Redis server of the test's own, for outage trials.

The outage trials stop, flush and restart these; the shared servers (5432, 6379) are never
touched. PostgreSQL is a fresh cluster (``initdb``) in a temporary directory on a free port,
with its socket in that directory; ``initdb`` refuses to run as root, and CI runs as root, so
the server's tools then run as the ``postgres`` user (the directory is handed to it). Redis is
``redis-server --save '' --appendonly no``: nothing persists, so a restart loses every key,
which is the point. A missing tool skips the test with the reason, or fails it in CI
(:mod:`tests.capabilities`), like the shared services do.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import NoReturn

import redis as redis_sync

from tests import capabilities
from tests.ports import PORT_TRIES, address_in_use, free_port

READY_TIMEOUT = 60.0
"""Seconds a server gets to come up (generous: the machine may be busy)."""


def missing(what: str) -> NoReturn:
    capabilities.missing(f"outage trials need {what}")


def _pg_tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
        found = str(candidates[-1]) if candidates else None
    if found is None:
        missing(f"PostgreSQL's {name} on PATH")
    return found


class PrivatePostgres:
    """A throw-away cluster: :meth:`create` it, :meth:`stop`/:meth:`start` it at will,
    :meth:`destroy` it (always, even when the test failed)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="gw-outage-pg-"))
        self.data = self.root / "data"
        self.logfile = self.root / "server.log"
        self.port = 0
        self.up = False
        self._as: list[str] = []
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                missing("a 'postgres' user to run initdb as (it refuses root)")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self._initdb = _pg_tool("initdb")
        self._pg_ctl = _pg_tool("pg_ctl")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def create(self) -> None:
        """initdb, then start on a free port (another one if that one was taken meanwhile,
        :data:`PORT_TRIES` times; any other failure at once, with the server's log)."""
        self._run([self._initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust",
                   "--no-sync", "-E", "UTF8"])
        for _ in range(PORT_TRIES):
            self.port = free_port()
            logged = self._log_size()
            try:
                self._run(self._start_args())
                self.up = True
                return
            except subprocess.CalledProcessError as exc:
                if not address_in_use(self._log_since(logged)):
                    raise RuntimeError(f"private PostgreSQL did not start: "
                                       f"{exc.stderr.decode(errors='replace')}\n"
                                       f"{self.log_tail()}") from exc
                # the port was taken between free_port() and the bind: another one
        raise RuntimeError(f"private PostgreSQL found no free port in {PORT_TRIES} tries: "
                           f"{self.log_tail()}")

    def _start_args(self) -> list[str]:
        # fsync off: a crash of the machine is not what these trials are about, speed is.
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
                   " -c fsync=off -c synchronous_commit=off -c full_page_writes=off")
        return [self._pg_ctl, "-D", str(self.data), "-l", str(self.logfile), "-w",
                "-t", str(int(READY_TIMEOUT)), "-o", options, "start"]

    async def stop(self) -> None:
        """``pg_ctl stop -m fast``: sessions are cut, the server goes down."""
        self.up = False
        await self._arun([self._pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "stop"])

    async def start(self) -> None:
        """Start again on the same port (``-w``: returns once it accepts connections)."""
        await self._arun(self._start_args())
        self.up = True

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            if (self.data / "postmaster.pid").exists():
                self._run([self._pg_ctl, "-D", str(self.data), "-m", "immediate", "-w",
                           "stop"])
        shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no server log)"

    def _log_size(self) -> int:
        try:
            return self.logfile.stat().st_size
        except OSError:
            return 0

    def _log_since(self, offset: int) -> str:
        """What the server logged past ``offset`` (pg_ctl appends every start to one log)."""
        try:
            with self.logfile.open("rb") as log:
                log.seek(offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def _run(self, args: list[str]) -> None:
        # cwd: a directory the postgres user may enter (not the checkout, maybe not theirs)
        subprocess.run([*self._as, *args], check=True, capture_output=True, cwd=self.root,
                       timeout=READY_TIMEOUT + 30)

    async def _arun(self, args: list[str]) -> None:
        proc = await asyncio.create_subprocess_exec(
            *self._as, *args, cwd=self.root, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
        async with asyncio.timeout(READY_TIMEOUT + 30):
            out, _ = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"{args[-1]} failed ({proc.returncode}): {out.decode()[-1000:]}"
                               f"\n{self.log_tail()}")


class PrivateRedis:
    """``redis-server`` without persistence on a port of its own; :meth:`restart` kills it
    (SIGKILL) and starts a fresh, empty one on the same port."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="gw-outage-redis-"))
        binary = shutil.which("redis-server")
        if binary is None:
            missing("redis-server on PATH")
        self._binary = binary
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def create(self) -> None:
        """Start on a free port (another one if that one was taken meanwhile,
        :data:`PORT_TRIES` times; any other failure at once, with the server's log)."""
        for _ in range(PORT_TRIES):
            self.port = free_port()
            self._spawn()
            if self._wait_ready():
                return
            self._kill()
            if not address_in_use(self.log_tail()):
                raise RuntimeError(f"private Redis did not start: {self.log_tail()}")
            # the port was taken between free_port() and the bind: another one
        raise RuntimeError(f"private Redis found no free port in {PORT_TRIES} tries: "
                           f"{self.log_tail()}")

    async def kill(self) -> None:
        """SIGKILL: every connection drops, every key is gone."""
        self._kill()

    async def start(self) -> None:
        """A fresh server on the same port (ours since the first start)."""
        self._spawn()
        ready = await asyncio.to_thread(self._wait_ready)
        if not ready:
            raise RuntimeError(f"private Redis did not start again: {self.log_tail()}")

    def destroy(self) -> None:
        self._kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self) -> str:
        try:
            return (self.root / f"redis-{self.starts}.log").read_text(errors="replace")[-2000:]
        except OSError:
            return "(no server log)"

    def _spawn(self) -> None:
        self.starts += 1
        with (self.root / f"redis-{self.starts}.log").open("wb") as out:
            self.proc = subprocess.Popen(
                [self._binary, "--port", str(self.port), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--dir", str(self.root)],
                stdout=out, stderr=out, stdin=subprocess.DEVNULL)

    def _wait_ready(self) -> bool:
        """True once our server answers on :attr:`port`. Only ours counts: whoever took the
        port may be a Redis too (the machine's other test servers), and the trials flush and
        kill what they think is theirs."""
        client = redis_sync.Redis(port=self.port, socket_connect_timeout=1, socket_timeout=2)
        try:
            deadline = time.monotonic() + READY_TIMEOUT
            while time.monotonic() < deadline:
                if self.proc is None or self.proc.poll() is not None:
                    return False
                with contextlib.suppress(redis_sync.RedisError, OSError):
                    if client.info("server").get("process_id") == self.proc.pid:
                        return True
                time.sleep(0.05)
            return False
        finally:
            client.close()

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
