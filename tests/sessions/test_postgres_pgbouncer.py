"""The PostgreSQL store through PgBouncer in transaction mode (``GATEWAY_STORE_PGBOUNCER``):
every kind of statement it sends works when consecutive transactions of one client
connection run on different server connections.

The PgBouncer is the test's own, on a free port, in front of the test database, with fewer
server connections than the store's pool has clients. A missing ``pgbouncer`` skips (fails
in CI, which installs it: tests/capabilities.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest

from sessions.postgres.store import PostgresSessionStore
from tests.capabilities import missing
from tests.ports import PORT_TRIES, address_in_use, free_port
from tests.sessions.pg import PG_URL, connect, fresh_schema
from tests.sessions.test_postgres_pool import exercise

pytestmark = [pytest.mark.services, pytest.mark.timeout(180)]


def pgbouncer_binary() -> str:
    found = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer"
                                          if os.access("/usr/sbin/pgbouncer", os.X_OK) else None)
    if found is None:
        missing("pgbouncer on PATH (apt-get install pgbouncer)")
    return found


@contextlib.contextmanager
def bouncer(server_connections: int) -> Iterator[int]:
    """A PgBouncer in transaction mode in front of the test database; its port."""
    binary = pgbouncer_binary()
    target = urlsplit(PG_URL)
    root = Path(tempfile.mkdtemp(prefix="gw-pgbouncer-"))
    proc: subprocess.Popen[bytes] | None = None
    try:
        if os.geteuid() == 0:  # it refuses to run as root
            shutil.chown(root, "postgres")
        for _ in range(PORT_TRIES):
            port = free_port()
            (root / "pgbouncer.ini").write_text(
                "[databases]\n"
                f"* = host={target.hostname} port={target.port or 5432}\n"
                "[pgbouncer]\n"
                f"listen_addr = 127.0.0.1\nlisten_port = {port}\n"
                f"unix_socket_dir = {root}\nauth_type = trust\n"
                f"auth_file = {root}/users.txt\npool_mode = transaction\n"
                f"default_pool_size = {server_connections}\nmax_client_conn = 100\n"
                f"logfile = {root}/pgbouncer.log\n")
            (root / "users.txt").write_text('"postgres" ""\n')
            prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
            proc = subprocess.Popen([*prefix, binary, str(root / "pgbouncer.ini")],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if wait_listening(proc, port):
                break
            log = (root / "pgbouncer.log").read_text(errors="replace") \
                if (root / "pgbouncer.log").exists() else ""
            if not address_in_use(log):
                raise RuntimeError(f"pgbouncer did not start: {log[-2000:]}")
        else:
            raise RuntimeError("pgbouncer found no free port")
        yield port
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(root, ignore_errors=True)


def wait_listening(proc: subprocess.Popen[bytes], port: int) -> bool:
    import socket
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.05)
    return False


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    await (await connect()).close()  # the database itself is there, or skip
    async with fresh_schema() as name:
        yield name


async def test_the_store_works_through_pgbouncer_in_transaction_mode(schema: str) -> None:
    """Six clients over two server connections: every statement the store, its inbox and its
    blobs send runs (no prepared statement is looked for on a connection that lacks it), and
    what was written reads back through a direct connection."""
    target = urlsplit(PG_URL)
    with bouncer(server_connections=2) as port:
        url = f"postgresql://postgres@127.0.0.1:{port}{target.path}"
        for _ in range(3):  # the same statements again, on connections that ran others
            async with PostgresSessionStore(url, schema=schema, max_size=6,
                                            statement_cache=False) as store:
                await exercise(store)
    direct = await asyncpg.connect(PG_URL)
    try:
        sessions = await direct.fetchval(f'SELECT count(*) FROM "{schema}".sessions')
    finally:
        await direct.close()
    assert sessions == 3 * 6  # exercise() keeps six conversations' sessions (erases one more)
