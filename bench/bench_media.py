"""Benchmark: attachments. A 3 MB photo through Telegram end to end, the blob write, and replay
expanding it, each beside a floor measured in the same run.

1. **Telegram end to end** (in-process, each subject on its own fake Bot API): from pushing
   a photo update (a 3 MB JPEG, 2048x1536, each in a new chat) to the fake recording the
   bot's reply. Subject: the gateway as ``gateway run`` builds it (long polling, JSONL store
   at durability ``turn``, file blobs), with a provider that builds and encodes the exact
   request body (the photo expanded to base64, as the SDK providers do) and answers at once.
   Two request shapes: ``openai`` (the photo is within its limits and stored as sent) and
   ``anthropic`` (scaled to 1568 px first, with Pillow). Floor: a bare PTB bot that polls,
   fetches the same photo (``get_file`` + download) and answers with ``send_message``: the
   least a bot that reads photos must do. The three take turns, round by round.
2. **Blob write**: ``FileBlobStore.put`` of 3 MB of new bytes (sha256, temporary file, fsync,
   rename, folder fsync) against a bare ``sha256`` + write + fsync of the same bytes to one file.
   Also the repeat put of bytes already stored (a stat), and both without fsync.
3. **Replay expansion**: loading the photo's blob for a recorded call (read, hash check) and
   building its request body (base64), against a bare read + base64 of the same file.

Medians of ``--rounds`` runs (default 9); ratios are subject / floor.

Run: .venv/bin/python bench/bench_media.py [--rounds 9]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import functools
import hashlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("PTB_TIMEDELTA", "1")

from bench._harness import machine_line

MB = 1024 * 1024
CHAT = 4242


def photo_bytes(seed: int = 7) -> bytes:
    """A 2048x1536 JPEG of about 3 MB (noise compresses badly, like a detailed photo)."""
    from tests.fakes.media import jpeg

    data = jpeg(2048, 1536, quality=92, noise=True, seed=seed)
    assert 2.5 * MB < len(data) < 4 * MB, len(data)
    return data


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


# -- 1. Telegram end to end -----------------------------------------------------------------------


class BodyProvider:
    """Answers at once, after building and encoding the request body exactly as an SDK
    provider does (the photo expanded to base64)."""

    def __init__(self, shape: str) -> None:
        from sessions.shapes import Shape

        self.name = "bench"
        self.shape: Shape = shape  # type: ignore[assignment]
        self.model = "bench-1"
        self.endpoint: str | None = None

    def params(self) -> dict[str, Any]:
        return {"max_tokens": 64}

    async def complete(self, request: Any, on_text: Any = None) -> Any:
        from gateway.edge.provider import ProviderResponse
        from sessions.shapes import encode_body, request_body

        encode_body(request_body(self.shape, request.system, request.messages, request.tools,
                                 request.model, request.params, blobs=request.blobs))
        return ProviderResponse({"role": "assistant", "content": [
            {"type": "text", "text": "A photo."}]}, "end_turn", {})

    async def aclose(self) -> None:
        return None


@contextlib.asynccontextmanager
async def gateway_subject(shape: str, photos: list[bytes],
                          tmp: str) -> AsyncIterator[Callable[[int], Awaitable[float]]]:
    """A gateway on its own fake Bot API; yields ``once(n)``: one photo, in chat n, to its
    reply, in seconds."""
    from app.compose import build_gateway
    from app.config import Settings
    from tests.fakes.telegram_api import FakeTelegramServer

    async with FakeTelegramServer() as tg:
        settings = Settings(  # type: ignore[call-arg]
            _env_file=None, GATEWAY_DATA_DIR=tmp, GATEWAY_PORT=0,
            GATEWAY_CHANNELS="telegram", TELEGRAM_BOT_TOKEN=tg.token,
            TELEGRAM_API_BASE_URL=tg.base_url, TELEGRAM_RATE_LIMIT="off",
            TELEGRAM_POLL_TIMEOUT=1, TELEGRAM_STALL_SECONDS=5,
            TELEGRAM_ALLOWED_USERS=",".join(str(CHAT + n) for n in range(len(photos))),
            GATEWAY_TYPING_DELAY=60, GATEWAY_LOG_LEVEL="WARNING")
        gateway = build_gateway(settings, provider=BodyProvider(shape))
        await gateway.start()

        async def once(n: int) -> float:
            seen = len(tg.calls("sendMessage"))
            started = time.perf_counter()
            # A chat each: every call carries one photo (a chat's later calls would carry its
            # earlier photos too, as far as the window allows).
            tg.user_media(CHAT + n, "photo", photos[n], caption=f"what is this? {n}")
            await tg.wait_for_sent(lambda _c: len(tg.calls("sendMessage")) > seen, timeout=60)
            return time.perf_counter() - started

        try:
            yield once
        finally:
            await gateway.aclose()


def fit_photo(data: bytes) -> None:
    from gateway.media.images import IMAGE_LIMITS, fit

    fit(data, "image/jpeg", IMAGE_LIMITS["anthropic"])


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@contextlib.asynccontextmanager
async def floor_subject(photos: list[bytes]) -> AsyncIterator[Callable[[int], Awaitable[float]]]:
    """A bare PTB bot: poll, fetch the photo, answer."""
    from telegram import Bot

    from tests.fakes.telegram_api import FakeTelegramServer

    async with FakeTelegramServer() as tg, Bot(tg.token, base_url=tg.base_url,
                                               base_file_url=tg.base_file_url) as bot:
        offset = 0

        async def once(n: int) -> float:
            nonlocal offset
            started = time.perf_counter()
            tg.user_media(CHAT + n, "photo", photos[n], caption=f"what is this? {n}")
            while True:
                for update in await bot.get_updates(offset=offset, timeout=1):
                    offset = update.update_id + 1
                    message = update.message
                    if message is None or not message.photo:
                        continue
                    file = await bot.get_file(message.photo[-1].file_id)
                    got = await file.download_as_bytearray()
                    assert len(got) == len(photos[n])
                    await bot.send_message(message.chat.id, "A photo.")
                    return time.perf_counter() - started

        yield once


async def end_to_end(photos: list[bytes]) -> tuple[dict[str, list[float]], list[str]]:
    """The three subjects measured in turn, round by round (so a load spike on the shared
    machine hits all of them alike), a new photo each round; the first round warms up."""
    samples: dict[str, list[float]] = {"floor": [], "openai": [], "anthropic": []}
    notes: list[str] = []
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        async with floor_subject(photos) as floor, \
                gateway_subject("openai", photos, a) as openai_once, \
                gateway_subject("anthropic", photos, b) as anthropic_once:
            subjects = {"floor": floor, "openai": openai_once, "anthropic": anthropic_once}
            for n in range(len(photos)):
                for name, once in subjects.items():
                    took = await once(n)
                    if n:
                        samples[name].append(took)
        for shape, tmp in (("openai", a), ("anthropic", b)):
            stored = await asyncio.to_thread(folder_size, Path(tmp, "blobs"))
            notes.append(f"{shape}: a photo is stored as {stored / len(photos) / MB:.2f} MB")
    return samples, notes


# -- 2. blob write ---------------------------------------------------------------------------


async def timed(work: Callable[[], Awaitable[object]], rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        await work()
        samples.append(time.perf_counter() - started)
    return samples


def variants(data: bytes, rounds: int) -> list[bytes]:
    """``rounds`` different blobs of ``data``'s size (so every put really writes)."""
    return [bytes([i]) + data[1:] for i in range(rounds)]


def bare_write(folder: Path, blob: bytes, durable: bool) -> None:
    """The floor: sha256, then one new file written (and fsynced when ``durable``)."""
    digest = hashlib.sha256(blob).hexdigest()
    fd = os.open(folder / digest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, blob)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


async def alternating(calls: dict[str, list[Callable[[], Awaitable[object]]]]
                      ) -> dict[str, list[float]]:
    """Each label's calls, timed, taking turns call by call (so the machine's load falls on
    every label alike)."""
    samples: dict[str, list[float]] = {label: [] for label in calls}
    for round_calls in zip(*calls.values(), strict=True):
        for label, call in zip(calls, round_calls, strict=True):
            started = time.perf_counter()
            await call()
            samples[label].append(time.perf_counter() - started)
    return samples


async def blob_writes(data: bytes, rounds: int) -> dict[str, list[float]]:
    from sessions.blob_files import FileBlobStore

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        calls: dict[str, list[Callable[[], Awaitable[object]]]] = {}
        for durable in (True, False):
            label = "fsync" if durable else "no fsync"
            store = FileBlobStore(root / f"s-{label}", durable=durable)
            calls[f"put ({label})"] = [functools.partial(store.put, "default", blob)
                                       for blob in variants(data, rounds)]
            folder = root / f"floor-{label}"
            await asyncio.to_thread(folder.mkdir)
            calls[f"floor ({label})"] = [
                functools.partial(asyncio.to_thread, bare_write, folder, blob, durable)
                for blob in variants(data, rounds)]
        repeat = FileBlobStore(root / "repeat")
        await repeat.put("default", data)
        calls["put, already stored"] = [functools.partial(repeat.put, "default", data)] * rounds
        return await alternating(calls)


# -- 3. replay expansion ---------------------------------------------------------------------


async def replay_expansion(data: bytes, rounds: int) -> dict[str, list[float]]:
    from sessions.attachments import BlobRef, ref_block
    from sessions.blob_files import FileBlobStore
    from sessions.blobs import load
    from sessions.jsonl import JsonlSessionStore
    from sessions.persist import persist_call
    from sessions.records import CallRequest, Prompt, Section
    from sessions.replay import replay_bytes

    with tempfile.TemporaryDirectory() as tmp:
        blobs = FileBlobStore(tmp)
        digest = await blobs.put("default", data)
        store = JsonlSessionStore(tmp, durability="none")
        writer = await store.create(channel="bench", conversation="c", session_id="s1")
        ref = BlobRef(digest, "photo.jpg", "image/jpeg", len(data))
        await writer.append([{"type": "message", "message": {
            "role": "user", "content": [ref_block(ref), {"type": "text", "text": "what?"}]}}])
        prompt = Prompt.from_sections([Section("soul", "You are a bench.")])
        await persist_call(writer, CallRequest(prompt, "initial", (), "anthropic", "m",
                                               {"max_tokens": 64}, ((0, 1),)))
        await writer.aclose()
        log = await store.read_log("default", "s1")
        replay = replay_bytes(log)
        turn = replay.call(1)

        async def expand() -> None:
            found = await load(blobs, "default", replay.attachments(turn))
            replay.request(turn, "anthropic", found)

        path = blobs.path_of("default", digest)

        async def floor() -> None:
            raw = await asyncio.to_thread(path.read_bytes)
            base64.b64encode(raw)

        return await alternating({"load blob + build body": [expand] * rounds,
                                  "floor: read + base64": [floor] * rounds})


# -- report ----------------------------------------------------------------------------------


def table(rows: list[tuple[str, float, float | None]]) -> list[str]:
    lines = ["| measure | median | vs floor |", "|---|---:|---:|"]
    for label, value, floor in rows:
        ratio = f"{value / floor:.2f}x" if floor else "floor"
        lines.append(f"| {label} | {value:.1f} ms | {ratio} |")
    return lines


async def main(rounds: int) -> None:
    photos = [photo_bytes(seed) for seed in range(rounds + 1)]
    data = photos[0]
    print(f"photo: {len(data) / MB:.2f} MB, 2048x1536 JPEG; {rounds} rounds each")
    e2e, notes = await end_to_end(photos)
    fitting = await timed(lambda: asyncio.to_thread(fit_photo, data), rounds)
    floor = median_ms(e2e["floor"])
    rows: list[tuple[str, float, float | None]] = [
        ("bare PTB bot: poll, get_file + download, send_message (floor)", floor, None)]
    for shape in ("openai", "anthropic"):
        rows.append((f"gateway, {shape} shape: photo to reply", median_ms(e2e[shape]), floor))
    notes.append(f"of the anthropic path, fitting the photo to 1568 px (Pillow: decode, "
                 f"scale, encode) alone takes {median_ms(fitting):.0f} ms")
    writes = await blob_writes(data, rounds)
    expansion = await replay_expansion(data, rounds)
    w = {k: median_ms(v) for k, v in writes.items()}
    e = {k: median_ms(v) for k, v in expansion.items()}
    lines = [
        "Telegram end to end (one 3 MB photo with a caption, closed loop):", "",
        *table(rows), "", *[f"- {n}" for n in notes], "",
        "Blob write (3 MB of new bytes each time):", "",
        *table([("bare sha256 + write + fsync (floor)", w["floor (fsync)"], None),
                ("FileBlobStore.put, durable", w["put (fsync)"], w["floor (fsync)"]),
                ("bare sha256 + write, no fsync (floor)", w["floor (no fsync)"], None),
                ("FileBlobStore.put, durability none", w["put (no fsync)"], w["floor (no fsync)"]),
                ("put of bytes already stored", w["put, already stored"], w["floor (no fsync)"])]),
        "",
        "Replay expanding it (one recorded call with the photo):", "",
        *table([("bare read + base64 (floor)", e["floor: read + base64"], None),
                ("load the blob (hash checked) + build the body", e["load blob + build body"],
                 e["floor: read + base64"])]),
        "", machine_line(),
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    asyncio.run(main(parser.parse_args().rounds))
