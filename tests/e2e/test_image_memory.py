"""The image memory budget, measured where it matters: a real ``gateway run`` process, four
decompression bombs of one format posted to the web API at once, its peak RSS read from
``/proc/<pid>/status`` (``VmHWM``, reset before each round through ``clear_refs``).

Each bomb is 7,680 x 7,680 pixels (59 megapixels) in a file of a few KB to 1 MB: as a PNG it
decodes to 236 MB, so four at once took 2.75 GB before the budget. Now every bomb is answered
(200 with a reply; a refused one's reply says why) or refused with a 4xx JSON error, peak RSS
rises by at most 256 MiB per round, and resident memory comes back near where it was.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
EDGE = 7680
MIB = 1024 * 1024
PEAK_BUDGET = 256 * MIB
SETTLED = 48 * MIB
"""How far above its level before a round resident memory may stay after it (allocator
slack, the round's session entries)."""
FORMATS: dict[str, tuple[str, str, dict[str, object]]] = {
    "png": ("PNG", "RGB", {}), "jpeg": ("JPEG", "RGB", {"quality": 50}),
    "gif": ("GIF", "P", {}), "webp": ("WEBP", "RGB", {"lossless": True})}


def bomb(kind: str) -> bytes:
    """A 59-megapixel image of one colour: a small file, a huge decode."""
    fmt, mode, options = FORMATS[kind]
    out = io.BytesIO()
    Image.new(mode, (EDGE, EDGE)).save(out, format=fmt, **options)
    return out.getvalue()


def memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of process ``pid``, in bytes."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name] = int(value.split()[0]) * 1024
    return found


def reset_peak(pid: int) -> None:
    """Set process ``pid``'s VmHWM to its VmRSS (a /proc file: no disk is touched)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


@contextlib.asynccontextmanager
async def gateway_process(tmp_path: Path) -> AsyncIterator[tuple[int, str]]:
    """``python -m gateway run`` with the web channel and the offline provider on a port of
    its own choosing; yields its pid and base URL, stops it with SIGTERM."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "OPENAI_",
                                                                     "ANTHROPIC_"))}
    env.update(PYTHONPATH=str(ROOT), GATEWAY_DATA_DIR=str(tmp_path / "data"),
               GATEWAY_PORT="0", GATEWAY_CHANNELS="web", GATEWAY_PROVIDER="offline")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "run", cwd=tmp_path, env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    try:
        seen = []
        async with asyncio.timeout(60):
            while not (match := re.search(rb"listening on (http://[\d.]+:\d+)",
                                          line := await proc.stderr.readline())):
                seen.append(line)
                assert line, b"".join(seen).decode()
        drain = asyncio.create_task(proc.stderr.read())  # keep its pipe from filling
        yield proc.pid, match.group(1).decode()
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
    drain.cancel()


async def chat(http: aiohttp.ClientSession, base: str, conversation: str, name: str,
               data: bytes) -> tuple[int, dict[str, object]]:
    body = {"conversation": conversation, "text": "what is this?",
            "attachments": [{"name": name, "data": base64.b64encode(data).decode()}]}
    async with http.post(base + "/api/chat", data=io.BytesIO(orjson.dumps(body)),
                         headers={"Content-Type": "application/json"}) as response:
        return response.status, orjson.loads(await response.read())


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    return {kind: bomb(kind) for kind in FORMATS}


async def test_four_bombs_at_once_stay_within_the_memory_budget(
        tmp_path: Path, bombs: dict[str, bytes]) -> None:
    """For each of PNG, JPEG, GIF and WebP: four 59-megapixel bombs posted at once are each
    answered (a reply; refused ones say the image is too large to decode) or refused with a
    4xx JSON error; peak RSS rises by at most 256 MiB; RSS settles back within 48 MiB."""
    rounds: dict[str, tuple[list[int], list[str], int, int]] = {}
    timeout = aiohttp.ClientTimeout(total=300)
    async with gateway_process(tmp_path) as (pid, base), \
            aiohttp.ClientSession(timeout=timeout) as http:
        # Pillow loaded and one real photo fitted first: the rounds measure bombs only.
        status, _ = await chat(http, base, "warm", "photo.jpg", bomb_free_photo())
        assert status == 200
        for kind, data in bombs.items():
            reset_peak(pid)
            before = memory(pid)["VmRSS"]
            answers = await asyncio.gather(*(
                chat(http, base, f"{kind}-{n}", f"bomb.{kind}", data) for n in range(4)))
            after = memory(pid)
            rounds[kind] = ([status for status, _ in answers],
                            [str(body.get("reply") or body.get("error")) for _, body in answers],
                            after["VmHWM"] - before, after["VmRSS"] - before)
    for kind, (statuses, texts, peak, settled) in rounds.items():
        print(f"{kind}: peak +{peak / MIB:.0f} MiB, settled +{settled / MIB:.0f} MiB, "
              f"{statuses}, {texts[0][:90]!r}")
    for kind, (statuses, texts, peak, settled) in rounds.items():
        assert all(s == 200 or 400 <= s < 500 for s in statuses), (kind, statuses, texts)
        assert all(texts), (kind, texts)
        assert peak <= PEAK_BUDGET, (kind, peak / MIB)
        assert settled <= SETTLED, (kind, settled / MIB)
    refused = {kind for kind, (_, texts, _, _) in rounds.items()
               if all("too large to decode safely" in text for text in texts)}
    assert refused == {"png", "gif", "webp"}  # the JPEG is decoded scaled down, and answered


def bomb_free_photo() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (3000, 2000), (90, 120, 200)).save(out, format="JPEG")
    return out.getvalue()
