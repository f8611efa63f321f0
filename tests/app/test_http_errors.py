"""Every error of the HTTP API is JSON, the router's own 404 and 405 included, and so is an
unknown path or wrong method anywhere; what a handler outside /api/ answers keeps its form."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from app.compose import build_gateway
from tests.channels.test_web import settings


async def test_api_errors_are_json(tmp_path: Path) -> None:
    """An unknown /api/ path is a JSON 404, a wrong method a JSON 405 with Allow, a handler's
    own error stays JSON; an unknown path outside /api/ (GET /nope) and a wrong method there
    are JSON too, while the page and /metrics keep their own forms."""
    gateway = build_gateway(settings(tmp_path))
    await gateway.start()
    base = f"http://127.0.0.1:{gateway.bound_port}"
    try:
        async with aiohttp.ClientSession() as client:
            async with client.get(f"{base}/api/nothing-here") as missing:
                assert (missing.status, missing.content_type) == (404, "application/json")
                assert await missing.json() == {"error": "not found"}
            async with client.get(f"{base}/api/chat") as wrong:
                assert (wrong.status, wrong.content_type) == (405, "application/json")
                assert await wrong.json() == {"error": "method not allowed"}
                assert "POST" in wrong.headers["Allow"]
            async with client.post(f"{base}/api/chat", data=b"{not json",
                                   headers={"Content-Type": "application/json"}) as bad:
                assert (bad.status, bad.content_type) == (400, "application/json")
                assert "error" in await bad.json()
            async with client.get(f"{base}/nope") as nope:
                assert (nope.status, nope.content_type) == (404, "application/json")
                assert await nope.json() == {"error": "not found"}
            async with client.post(f"{base}/healthz") as wrong_method:
                assert (wrong_method.status, wrong_method.content_type) == (405,
                                                                            "application/json")
                assert wrong_method.headers["Allow"] == "GET,HEAD"
            async with client.get(f"{base}/") as page:
                assert (page.status, page.content_type) == (200, "text/html")
            async with client.get(f"{base}/metrics") as metrics:
                assert (metrics.status, metrics.content_type) == (200, "text/plain")
    finally:
        await gateway.aclose()
