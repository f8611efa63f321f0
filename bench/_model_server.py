"""A model with a realistic latency, in a process of its own (so its CPU is counted apart):
the fake OpenAI/Anthropic server of the tests (``tests/fakes/providers.py``) answering each
request with ``echo: <text>`` after the delay the message asks for (``delay=<seconds>`` in
its text; none: at once). It prints its port, then serves until it is terminated.

Run: .venv/bin/python bench/_model_server.py
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fakes.providers import ApiName, FakeProviderServer, Reply, echo_reply, last_user_text

DELAY = re.compile(r"delay=([0-9.]+)")


def delayed(api: ApiName, body: dict[str, Any]) -> Reply:
    found = DELAY.search(last_user_text(body))
    answer = echo_reply(api, body)
    return Reply.hang(float(found.group(1)), answer) if found else answer


async def main() -> None:
    server = FakeProviderServer()
    server.validate = False  # the SDK's request types are checked by the tests, not here
    server.default = delayed
    await server.start()
    print(server.port, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    while not stop.is_set():
        server.requests.clear()  # kept per request by the fake: not needed here
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 5)
    await server.close()


if __name__ == "__main__":
    asyncio.run(main())
