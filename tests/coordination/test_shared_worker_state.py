"""What several workers must do alike, through their Redis: an admin sign-out on one worker
ends that login on the others, a browser is one person (with its one set of conversations)
whichever worker answers it, and an erasure empties the MCP servers' stderr logs a worker
keeps in its own data folder. Two gateways in this process, each with a data folder of its
own, over the test's Redis prefix and schema."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from app import control
from app.admin.auth import COOKIE as ADMIN_COOKIE
from app.compose import build_gateway
from app.compose_channels import WEB_IDENTITY_KEY
from app.config import Settings
from app.server import Gateway
from channels.web.identity import COOKIE
from providers.offline import OfflineProvider
from sessions import entries
from sessions.postgres.store import PostgresSessionStore
from tests.app.cli.test_forget_cli import acli
from tests.coordination.services import REDIS_URL
from tests.sessions.pg import PG_URL

pytestmark = pytest.mark.services

ADMIN_TOKEN = "adm1n-T0ken-for-the-tests_Qx7vZ9kW"


@asynccontextmanager
async def two_workers(tmp_path: Path, prefix: str, schema: str) -> AsyncIterator[list[str]]:
    """Two started gateways (web chat, viewer); their base URLs."""
    gateways: list[Gateway] = []
    try:
        for n in range(2):
            values: dict[str, Any] = {
                "GATEWAY_DATA_DIR": str(tmp_path / f"w{n}"), "GATEWAY_PORT": 0,
                "GATEWAY_CHANNELS": "web", "GATEWAY_REDIS_URL": REDIS_URL,
                "GATEWAY_REDIS_PREFIX": prefix, "GATEWAY_STORE_URL": PG_URL,
                "GATEWAY_STORE_SCHEMA": schema, "GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN}
            settings = Settings(_env_file=None, **values)  # type: ignore[call-arg]  # pydantic-settings
            gateways.append(build_gateway(settings, provider=OfflineProvider()))
            await gateways[-1].start()
        yield [f"http://127.0.0.1:{g.bound_port}" for g in gateways]
    finally:
        for gateway in gateways:
            await gateway.aclose()


async def test_signing_out_on_one_worker_ends_the_login_on_the_other(
        tmp_path: Path, prefix: str, schema: str) -> None:
    """A login cookie from worker 0 opens the viewer on both; after signing out on worker 0,
    a copy of it is refused on worker 1 too (it was accepted there before: the sign-in is
    shared, only its end was not)."""
    async with two_workers(tmp_path, prefix, schema) as (first, second), \
            aiohttp.ClientSession() as http:
        form = aiohttp.FormData({"token": ADMIN_TOKEN, "next": "/admin/"})
        async with http.post(first + "/admin/login", data=form,
                             allow_redirects=False) as response:
            assert response.status == 303
            cookie = {"Cookie": f"{ADMIN_COOKIE}={response.cookies[ADMIN_COOKIE].value}"}
        statuses = []
        for base in (first, second):
            async with http.get(base + "/admin/", headers=cookie) as response:
                statuses.append(response.status)
        async with http.post(first + "/admin/logout", headers=cookie,
                             allow_redirects=False) as response:
            statuses.append(response.status)
        for base in (second, first):
            async with http.get(base + "/admin/", headers=cookie) as response:
                statuses.append(response.status)
        async with http.get(second + "/admin/",
                            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as response:
            statuses.append(response.status)  # the token itself still lets the operator in
    assert statuses == [200, 200, 303, 401, 401, 200]


async def test_a_browser_is_one_person_on_every_worker(
        tmp_path: Path, prefix: str, schema: str) -> None:
    """The workers agree on one web identity key (each data folder ends up holding it): a
    browser given its cookie by worker 0 continues its conversation on worker 1, and a
    cookie-less client of the same address is one person on both too."""
    async with two_workers(tmp_path, prefix, schema) as (first, second), \
            aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser, \
            aiohttp.ClientSession() as api:
        async with browser.get(first + "/") as page:
            assert COOKIE in page.cookies
        seen = []
        for http in (browser, api):
            async with http.post(first + "/api/chat",
                                 json={"conversation": "c1", "text": "said on w0"}) as response:
                assert response.status == 200, await response.text()
            async with http.get(second + "/api/history",
                                params={"conversation": "c1"}) as response:
                assert response.status == 200
                seen.append([m["text"] for m in (await response.json())["messages"]
                             if m["role"] == "user"])
    assert seen == [["said on w0"], ["said on w0"]]
    keys = {(tmp_path / f"w{n}" / "state" / WEB_IDENTITY_KEY).read_bytes() for n in range(2)}
    assert len(keys) == 1


async def test_sign_outs_without_redis_fail_closed() -> None:
    """Redis unreachable: a sign-out taken here still holds here, and whether another sign-in
    was ended cannot be told, so it is not taken as valid (the viewer answers 503)."""
    from app.admin.auth import Revoked
    from coordination.redis_signouts import RedisSignOuts
    from gateway.edge.signouts import SignOutsUnavailableError
    from tests.ports import free_port

    signouts = RedisSignOuts(f"redis://127.0.0.1:{free_port()}/0", "gwtest:none:", Revoked())
    try:
        await signouts.revoke("mine", 2e9)
        assert await signouts.revoked("mine")
        with pytest.raises(SignOutsUnavailableError):
            await signouts.revoked("someone-else")
    finally:
        await signouts.aclose()
        await signouts.aclose()  # idempotent


@pytest.mark.parametrize("via", ["cli", "worker"])
async def test_an_erasure_empties_the_mcp_logs_of_every_worker(
        tmp_path: Path, prefix: str, schema: str, monkeypatch: pytest.MonkeyPatch,
        via: str) -> None:
    """The person's session called the ``clock`` server, which worker 1 runs and logs in its
    own data folder. The erasure is run by ``gateway forget`` (with worker 0's settings: it
    holds both workers itself) or by worker 0 (asked on its control socket): either way, as
    the workers let go, worker 1 empties its ``clock`` logs and says so, and the answer lists
    them apart from what the tombstone counts. Another server's log is left as it was."""
    store = await PostgresSessionStore.connect(PG_URL, schema=schema)
    try:
        writer = await store.create(tenant="default", channel="slack",
                                    conversation="slack:lovelace", session_id="dm")
        await writer.append([entries.message({"role": "user", "content": "hi"},
                                             {"sender": "lovelace"})])
        await writer.append([entries.message(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                          "content": "ok"}]},
            {"toolCalls": [{"id": "t1", "tool": "clock__now", "server": "clock",
                            "name": "now", "ms": 1.0, "outcome": "ok"}]})])
        await writer.aclose()
    finally:
        await store.aclose()
    logs = tmp_path / "w1" / "mcp-logs"
    logs.mkdir(parents=True)
    (logs / "clock.log").write_text("called by lovelace\n")
    (logs / "clock.log.1").write_text("lovelace, earlier\n")
    (logs / "weather.log").write_text("someone else's\n")
    for name, value in (("GATEWAY_REDIS_URL", REDIS_URL), ("GATEWAY_REDIS_PREFIX", prefix)):
        monkeypatch.setenv(name, value)
    async with two_workers(tmp_path, prefix, schema):
        if via == "cli":
            code, out, err = await acli("forget", "--user", "slack:lovelace", "--data-dir",
                                        str(tmp_path / "w0"), "--store-url", PG_URL,
                                        "--schema", schema)
            assert (code, err) == (0, ""), out
            lines = [line.split() for line in out.splitlines()]
            elsewhere = [name for kind, name, *_ in lines if kind == "mcp-log"]
            assert lines[-1] == ["tombstone", "recorded", "(1", "session)"], out
        else:
            answer = await control.ask(tmp_path / "w0", {
                "op": "forget", "user": "slack:lovelace", "tenant": "default",
                "requested_by": "operator"}, 120)
            assert answer is not None
            assert answer["ok"], answer
            assert answer["removed"] == [["session", "dm"]]
            elsewhere = [name for kind, name in answer["elsewhere"] if kind == "mcp-log"]
    assert sorted(name.split(":", 1)[1] for name in elsewhere) == ["clock.log", "clock.log.1"]
    assert (logs / "clock.log").read_bytes() == b""
    assert (logs / "clock.log.1").read_bytes() == b""
    assert (logs / "weather.log").read_text() == "someone else's\n"
