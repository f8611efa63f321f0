"""Every error of the HTTP API is JSON, the router's own 404 and 405 included, while other
paths keep their forms."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from app.compose import build_gateway
from tests.channels.test_web import settings


async def test_api_errors_are_json(tmp_path: Path) -> None:
    """An unknown /api/ path is a JSON 404, a wrong method a JSON 405 with Allow, a handler's
    own error stays JSON; a non-API unknown path is still aiohttp's plain 404."""
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
            async with client.get(f"{base}/not-an-api") as page:
                assert (page.status, page.content_type) == (404, "text/plain")
    finally:
        await gateway.aclose()
