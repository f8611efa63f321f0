"""Real ``gateway run`` worker processes for the multi-worker tests, and a web-chat client.

Each worker is ``python -m gateway run`` with the web channel and the offline provider, on its
own port, sharing the test's PostgreSQL schema and Redis prefix. The client sends a message
over ``POST /api/chat`` with ``"stream": true`` and a client id; the ``session`` event
acknowledges it, the ``done`` event carries the reply (a retry of an id already received gets
the first delivery's answer, or a 504 when it is not at hand in time).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from gateway.persona.workspace import seed_if_empty
from tests.coordination.services import REDIS_URL
from tests.ports import PORT_TRIES, address_in_use, free_port
from tests.sessions.pg import PG_URL

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class WorkerProcess:
    name: str
    port: int
    proc: asyncio.subprocess.Process
    log: Path
    env: dict[str, str]
    cwd: Path
    log_from: int = 0
    """Where this launch's lines start in ``log``."""

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None


async def start_workers(count: int, *, tmp: Path, schema: str, prefix: str,
                        lease_ttl: float = 2.0, extra: dict[str, str] | None = None,
                        store_url: str = PG_URL, redis_url: str = REDIS_URL,
                        each: Sequence[Mapping[str, str]] = (),
                        ) -> list[WorkerProcess]:
    """``count`` workers, each healthy on /healthz before this returns. ``each[n]`` is added
    to worker ``n``'s environment (e.g. its own provider)."""
    persona = tmp / "persona"
    seed_if_empty(persona, "Lisa")  # seeded once, before the workers share it
    env = {
        **os.environ,
        "GATEWAY_CHANNELS": "web", "GATEWAY_PROVIDER": "offline", "GATEWAY_HOST": "127.0.0.1",
        "GATEWAY_PERSONA_DIR": str(persona), "GATEWAY_STORE_URL": store_url,
        "GATEWAY_STORE_SCHEMA": schema, "GATEWAY_REDIS_URL": redis_url,
        "GATEWAY_REDIS_PREFIX": prefix, "GATEWAY_LEASE_TTL": str(lease_ttl),
        "GATEWAY_LOG_LEVEL": "WARNING", "GATEWAY_SHUTDOWN_GRACE": "3",
        "GATEWAY_MAX_CONCURRENT_TURNS": "64", "PYTHONPATH": str(ROOT),
        **(extra or {}),
    }
    workers: list[WorkerProcess] = []
    try:
        for n in range(count):
            own = {**env, "GATEWAY_DATA_DIR": str(tmp / f"w{n}"),
                   **(each[n] if n < len(each) else {})}
            workers.append(await _launch(f"w{n}", own, tmp, tmp / f"worker{n}.log"))
        async with aiohttp.ClientSession() as http:
            for n, worker in enumerate(workers):
                workers[n] = await _healthy(http, worker)
    except BaseException:
        await stop_workers(workers)  # none left running when one did not come up
        raise
    return workers


async def _launch(name: str, env: dict[str, str], cwd: Path, log: Path) -> WorkerProcess:
    port = free_port()
    with log.open("ab") as out:  # appended: a relaunch keeps the earlier attempt's lines
        start = out.tell()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "run", cwd=cwd, stdout=out, stderr=out,
            env={**env, "GATEWAY_PORT": str(port)},
        )
    return WorkerProcess(name, port, proc, log, env, cwd, start)


async def _healthy(http: aiohttp.ClientSession, worker: WorkerProcess) -> WorkerProcess:
    """``worker``, or its relaunch on another port: the port free_port() found can be taken
    (by any process's outgoing connection) before the worker binds it, which failed this
    module's tests now and then on a busy machine."""
    for _ in range(PORT_TRIES):
        async with asyncio.timeout(60):
            while True:
                if not worker.alive:
                    await worker.proc.wait()
                    break
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"{worker.base}/healthz") as response:
                        if response.status == 200 and _ours(worker, await response.json()):
                            return worker
                await asyncio.sleep(0.1)
        text = worker.log.read_bytes()[worker.log_from:].decode(errors="replace")
        if not address_in_use(text):
            raise RuntimeError(f"{worker.name} exited: {text[-2000:]}")
        worker = await _launch(worker.name, worker.env, worker.cwd, worker.log)
    raise RuntimeError(f"{worker.name}: no free port in {PORT_TRIES} tries")


def _ours(worker: WorkerProcess, health: dict[str, object]) -> bool:
    """Whether /healthz was answered by this worker, not by whoever took its port."""
    coordination = health.get("coordination")
    name = coordination.get("worker") if isinstance(coordination, dict) else None
    return not isinstance(name, str) or name.startswith(f"w{worker.proc.pid}-")


async def stop_workers(workers: list[WorkerProcess]) -> None:
    """SIGTERM (a clean shutdown), then SIGKILL whatever is still running after a while."""
    for worker in workers:
        if worker.alive:
            worker.proc.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            await asyncio.wait_for(worker.proc.wait(), 15)
        except TimeoutError:
            worker.proc.kill()
            await worker.proc.wait()


@dataclass
class Sent:
    """What the client knows about one message."""

    conversation: str
    client_id: str
    text: str
    acked: bool = False
    reply: str | None = None
    error: str | None = None
    failed: str | None = None
    """The gateway's failure reply (its apology), when that is what the request got."""
    attempts: list[str] = field(default_factory=list)
    died: bool = False
    """A request carrying it broke off with a worker (connection reset mid-way)."""
    answered_at: float | None = None
    """Wall-clock time its answer reached the client (``done``)."""


Picker = Callable[[list[WorkerProcess]], WorkerProcess]


class ChatClient:
    """Sends messages to random live workers; retries with the same id when a worker dies."""

    def __init__(self, http: aiohttp.ClientSession, workers: list[WorkerProcess],
                 pick: Picker) -> None:
        self.http = http
        self.workers = workers
        self.pick = pick

    async def send(self, sent: Sent, acked: asyncio.Event) -> None:
        while True:
            live = [w for w in self.workers if w.alive]
            worker = self.pick(live)
            sent.attempts.append(worker.name)
            try:
                await self._post(worker, sent, acked)
                return
            except (aiohttp.ClientError, ConnectionError) as exc:
                sent.died = True
                if sent.acked:  # recorded or queued before the worker went: no resend
                    sent.error = type(exc).__name__
                    return
                await asyncio.sleep(0.05)  # not acknowledged: send it again, same id

    async def _post(self, worker: WorkerProcess, sent: Sent, acked: asyncio.Event) -> None:
        body = {"conversation": sent.conversation, "text": sent.text, "id": sent.client_id,
                "stream": True}
        async with self.http.post(f"{worker.base}/api/chat", json=body) as response:
            if response.status == 504 and sent.attempts[:-1]:  # an earlier attempt got
                sent.acked = True  # through; its answer was not at hand in time
                acked.set()
                return
            if response.status != 200:
                raise aiohttp.ClientResponseError(response.request_info, (),
                                                  status=response.status)
            async for event, data in sse_events(response):
                if event == "session":
                    sent.acked = True
                    acked.set()
                elif event == "done":
                    sent.reply = str(data["reply"])
                    sent.answered_at = time.time()
                    return
                elif event == "error":
                    sent.error = str(data.get("error"))
                    return
            raise aiohttp.ServerDisconnectedError("stream ended early")


async def sse_events(response: aiohttp.ClientResponse) -> AsyncIterator[tuple[str | None, Any]]:
    """The web chat's server-sent events as ``(event, parsed data)``, in order."""
    event = None
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            yield event, orjson.loads(line[6:])
