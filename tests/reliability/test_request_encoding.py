"""Compressed request bodies against a real running gateway: refused with 415 on every path
(API, webhooks, the viewer's sign-in, ``/healthz``, an unknown path) before any handler looks
at them, so nobody can make the gateway inflate a body before it knows who is asking.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import orjson
import pytest

from tests.reliability.test_bad_input import TG_SECRET, metric, running_stack

BOMB = gzip.compress(b"\0" * (16 * 1024 * 1024), compresslevel=9)
"""16 MiB of zeros in about 16 KiB: inflated, eight times the largest body any path takes."""
PATHS = [
    ("POST", "/api/chat"),
    ("POST", "/slack/events"),
    ("POST", "/telegram/webhook"),
    ("POST", "/admin/login"),
    ("GET", "/healthz"),
    ("POST", "/no/such/path"),
]


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "GZIP, identity"])
async def test_every_path_refuses_a_compressed_body_with_415(tmp_path: Path,
                                                             encoding: str) -> None:
    """Each path answers 415 with a JSON error for a body in any Content-Encoding, and nothing
    reaches a channel (no turn, no refusal counted as a bad signature or token)."""
    body = zlib.compress(b"{}" * 1000) if encoding == "deflate" else BOMB
    async with running_stack(tmp_path) as stack:
        answers = {}
        for method, path in PATHS:
            headers = {"Content-Encoding": encoding, "Content-Type": "application/json",
                       "X-Telegram-Bot-Api-Secret-Token": TG_SECRET,
                       **stack.slack.sign(body)}
            status, raw = await stack.request(method, path, body, headers)
            answers[path] = (status, "error" in orjson.loads(raw))
        turns = metric(stack.gateway, "gateway_turns_total")
        refused = metric(stack.gateway, "gateway_requests_refused_total")
    assert answers == {path: (415, True) for _, path in PATHS}
    assert (turns, refused) == (0, 0)


async def test_identity_encoding_is_an_ordinary_body(tmp_path: Path) -> None:
    """``Content-Encoding: identity`` is no encoding: the web chat answers it as usual."""
    async with running_stack(tmp_path) as stack:
        status, raw = await stack.request(
            "POST", "/api/chat", orjson.dumps({"conversation": "c1", "text": "hi"}),
            {"Content-Encoding": "identity", "Content-Type": "application/json"})
    assert status == 200, raw
    assert orjson.loads(raw)["reply"]
