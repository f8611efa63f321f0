"""The public endpoints' limits against a real running gateway: cheap checks before a body is
read, body caps, header and body time limits, header size limits, who may read ``/metrics``,
throttled admin sign-ins and a safe ``next``.

One gateway per test, as in :mod:`tests.reliability.test_bad_input` (web, Slack Events API,
Telegram webhook, admin viewer, fake platforms), with ``GATEWAY_HTTP_TIMEOUT`` at 0.5 s so that
the time limits show quickly. Slow and short clients speak raw HTTP over a socket: a client
library would not send a request it knows to be incomplete.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil
import pytest
from pydantic import SecretStr

from app.admin.throttle import FIRST_DELAY, FORGET, FREE_FAILURES, LoginThrottle
from app.config import Settings
from tests.capabilities import missing
from tests.reliability.test_bad_input import (
    ADMIN_TOKEN,
    SLACK_USER,
    TG_SECRET,
    Stack,
    metric,
    running_stack,
)

TIMEOUT = 0.5
ANSWER_WITHIN = 5.0
"""Seconds a test waits for an answer that must come at once (or after TIMEOUT)."""
MIB = 1024 * 1024


def started(tmp_path: Path, **overrides: Any) -> contextlib.AbstractAsyncContextManager[Stack]:
    """A started gateway with a 0.5 s HTTP time limit (and ``overrides``)."""
    return running_stack(tmp_path, **{"http_timeout": TIMEOUT, **overrides})


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    """A started gateway with a 0.5 s HTTP time limit."""
    async with started(tmp_path) as running:
        yield running


async def raw(port: int, head: bytes, body: bytes = b"", host: str = "127.0.0.1") -> str:
    """Send ``head`` (request line and headers, without the blank line) and ``body`` as they
    are, then wait for the status line; "" if the server closed the connection instead."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(head + b"\r\n\r\n" + body)
        await writer.drain()
        async with asyncio.timeout(ANSWER_WITHIN):
            line = await reader.readline()
        return line.decode("latin-1").strip()
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def request_head(path: str, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return "\r\n".join(lines).encode()


def refused(stack: Stack, endpoint: str) -> float:
    return metric(stack.gateway, "gateway_requests_refused_total", endpoint=endpoint)


# -- Slack: cheap checks first, a body cap, refusals counted ------------------------------------


async def test_unsigned_slack_requests_are_refused_before_their_body_is_read(
    stack: Stack,
) -> None:
    """With no signature, a malformed one, or a timestamp that is junk, stale or from the
    future, a request announcing 2 MiB gets its 401 after 1 KiB was sent: the rest is never
    waited for (a 408 would mean the body was being read)."""
    good = stack.slack.sign(b"{}")
    now = int(time.time())
    variants = {
        "no signature": {"X-Slack-Request-Timestamp": str(now)},
        "malformed signature": {**good, "X-Slack-Signature": "v0=xyz"},
        "junk timestamp": {**good, "X-Slack-Request-Timestamp": "soon"},
        "stale timestamp": {**good, "X-Slack-Request-Timestamp": str(now - 301)},
        # A minute past the 300 s window, not one second: ``now`` is cut down to the second
        # and the server reads its clock later, so ``now + 301`` fell back inside the window
        # whenever a second ticked over before the request was checked (413, not 401).
        "future timestamp": {**good, "X-Slack-Request-Timestamp": str(now + 360)},
    }
    answers = {}
    for label, headers in variants.items():
        head = request_head("/slack/events", {**headers, "Content-Type": "application/json",
                                              "Content-Length": str(2 * MIB)})
        answers[label] = await raw(stack.gateway.bound_port, head, b"{" * 1024)
    assert answers == dict.fromkeys(variants, "HTTP/1.1 401 Unauthorized")
    assert refused(stack, "slack events") == len(variants)


async def test_slack_bodies_are_capped_near_real_event_sizes(stack: Stack) -> None:
    """A signed request announcing more than 512 KiB is a 413 before its body is sent; one that
    sends more than that without announcing it (chunked) is a 413 too; nothing is recorded."""
    headers = {**stack.slack.sign(b"x"), "Content-Type": "application/json",
               "Content-Length": str(600 * 1024)}
    assert await raw(stack.gateway.bound_port, request_head("/slack/events", headers)) \
        == "HTTP/1.1 413 Request Entity Too Large"

    body = orjson.dumps(stack.slack.dm_event(SLACK_USER, "y" * (600 * 1024)))

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 64 * 1024):
            yield body[start:start + 64 * 1024]

    async with stack.http.post(stack.base + "/slack/events", data=chunks(), headers={
            "Content-Type": "application/json", **stack.slack.sign(body)}) as response:
        assert response.status == 413
    assert metric(stack.gateway, "gateway_inbound_total") == 0


async def test_refusals_are_counted_and_logged_once_per_episode(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """40 forged Slack requests and 40 wrong Telegram secrets: each counted, one log line per
    endpoint."""
    caplog.set_level(logging.INFO, logger="channels")
    body = orjson.dumps(stack.slack.dm_event(SLACK_USER, "hi"))
    forged = {**stack.slack.sign(body), "X-Slack-Signature": "v0=" + "0" * 64,
              "Content-Type": "application/json"}
    assert stack.telegram is not None
    update = stack.telegram.user_message(4242, "hi")
    stack.telegram.pending_updates.clear()
    statuses = set()
    for _ in range(40):
        status, _ = await stack.request("POST", "/slack/events", body, forged)
        statuses.add(status)
        status, _ = await stack.telegram.deliver_webhook(stack.base + "/telegram/webhook",
                                                         update, secret="wrong")
        statuses.add(status)
    assert statuses == {401, 403}
    assert (refused(stack, "slack events"), refused(stack, "telegram webhook")) == (40, 40)
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert [line.split(":")[0] for line in lines] == ["slack events", "telegram webhook"]


# -- the server: time limits and header limits ---------------------------------------------------


async def test_slow_clients_are_disconnected(stack: Stack) -> None:
    """20 connections that send half their headers and stop are closed by the server once
    the HTTP time limit has passed."""
    port = stack.gateway.bound_port
    connections = [await asyncio.open_connection("127.0.0.1", port) for _ in range(20)]
    started_at = time.monotonic()
    for _, writer in connections:
        writer.write(b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half: ")
    async with asyncio.timeout(ANSWER_WITHIN):
        leftovers = [await reader.read() for reader, _ in connections]
    took = time.monotonic() - started_at
    for _, writer in connections:
        writer.close()
    assert leftovers == [b""] * 20  # closed, nothing answered
    assert took >= TIMEOUT * 0.9


async def test_a_body_shorter_than_announced_gets_408(stack: Stack) -> None:
    """A body that stops short of its Content-Length is a 408 after the time limit on every
    endpoint that reads one (chat, Slack, Telegram, admin sign-in); nothing is recorded."""
    port = stack.gateway.bound_port
    slack = {**stack.slack.sign(b"short"), "Content-Type": "application/json"}
    cases = {
        "/api/chat": {"Content-Type": "application/json"},
        "/slack/events": slack,
        "/telegram/webhook": {"X-Telegram-Bot-Api-Secret-Token": TG_SECRET,
                              "Content-Type": "application/json"},
        "/admin/login": {"Content-Type": "application/x-www-form-urlencoded"},
    }
    answers = {}
    for path, headers in cases.items():
        head = request_head(path, {**headers, "Content-Length": "100"})
        answers[path] = await raw(port, head, b"0123456789")
    assert answers == dict.fromkeys(cases, "HTTP/1.1 408 Request Timeout")
    assert metric(stack.gateway, "gateway_inbound_total") == 0


async def test_header_limits(stack: Stack) -> None:
    """100 headers of 8 KB are refused by the parser (400); 30 of 8 KB (240 KB in all) get
    431; an ordinary request with 20 short headers is served."""
    port = stack.gateway.bound_port
    big = "v" * 8000

    def get(count: int, value: str) -> bytes:
        lines = ["GET /healthz HTTP/1.1", "Host: 127.0.0.1",
                 *(f"X-Pad-{n}: {value}" for n in range(count))]
        return "\r\n".join(lines).encode()

    assert (await raw(port, get(100, big))).endswith(" 400 Bad Request")
    assert await raw(port, get(30, big)) == "HTTP/1.1 431 Request Header Fields Too Large"
    assert await raw(port, get(20, "short")) == "HTTP/1.1 200 OK"


# -- /metrics and /healthz -------------------------------------------------------------------------


def outside_address() -> str | None:
    """A non-loopback IPv4 address of this machine, if it has one."""
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return str(address.address)
    return None


async def get_json(http: aiohttp.ClientSession, url: str,
                   headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with http.get(url, headers=headers or {}) as response:
        text = await response.text()
        return response.status, orjson.loads(text) if text.startswith("{") else text


async def test_metrics_and_health_details_are_for_this_machine_only(stack: Stack) -> None:
    """Asked with a non-local Host (a proxy forwarding a public name, a rebinding page),
    /metrics is 403 and /healthz says only whether the gateway is up; asked locally, both
    answer in full."""
    elsewhere = {"Host": "gateway.example.com"}
    status, body = await get_json(stack.http, stack.base + "/metrics", elsewhere)
    assert status == 403
    status, body = await get_json(stack.http, stack.base + "/healthz", elsewhere)
    assert (status, body) == (200, {"ok": True})
    status, body = await get_json(stack.http, stack.base + "/healthz")
    assert status == 200
    assert {"channels", "queued", "coordination"} <= set(body)
    status, text = await get_json(stack.http, stack.base + "/metrics")
    assert status == 200
    assert "gateway_requests_refused_total" in text


async def test_a_remote_peer_gets_neither_metrics_nor_health_details(tmp_path: Path) -> None:
    """Bound to every address (with a web token), a request arriving on a non-loopback address
    gets 403 from /metrics and the minimal /healthz, whatever Host it names."""
    address = outside_address()
    if address is None:
        missing("this machine has no non-loopback IPv4 address to connect from")
    async with started(tmp_path, host="0.0.0.0",
                       web_token=SecretStr(ADMIN_TOKEN.replace("adm1n", "web00"))) as stack:
        base = f"http://{address}:{stack.gateway.bound_port}"
        local = {"Host": f"127.0.0.1:{stack.gateway.bound_port}"}
        status, _ = await get_json(stack.http, base + "/metrics", local)
        assert status == 403
        assert await get_json(stack.http, base + "/healthz", local) == (200, {"ok": True})


async def test_a_metrics_token_opens_metrics_to_a_scraper(tmp_path: Path) -> None:
    """With GATEWAY_METRICS_TOKEN, /metrics and the full /healthz need it (401 without, from
    anywhere); with it they answer."""
    token = "metrics-t0ken-for-the-tests"
    async with started(tmp_path, metrics_token=SecretStr(token)) as stack:
        bearer = {"Authorization": f"Bearer {token}"}
        assert (await get_json(stack.http, stack.base + "/metrics"))[0] == 401
        assert (await get_json(stack.http, stack.base + "/metrics", bearer))[0] == 200
        assert await get_json(stack.http, stack.base + "/healthz") == (200, {"ok": True})
        status, body = await get_json(stack.http, stack.base + "/healthz", bearer)
        assert (status, "channels" in body) == (200, True)


# -- admin sign-in ---------------------------------------------------------------------------------


async def sign_in(stack: Stack, token: str, next_url: str = "/admin/") -> tuple[int, str]:
    """POST the sign-in form; (status, Location)."""
    form = aiohttp.FormData({"token": token, "next": next_url})
    async with stack.http.post(stack.base + "/admin/login", data=form,
                               allow_redirects=False) as response:
        await response.read()
        return response.status, response.headers.get("Location", "")


async def test_wrong_admin_tokens_are_throttled_and_logged_without_the_guess(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """After a few wrong tokens a client's next wrong ones get 429 with Retry-After; Bearer
    guesses count the same; the right token still signs in (an attacker cannot lock the
    operator out); every failure is logged with the client and the count, never the guess."""
    caplog.set_level(logging.INFO, logger="app.admin.site")
    guesses = [f"guess-number-{n}" for n in range(FREE_FAILURES)]
    statuses = [(await sign_in(stack, guess))[0] for guess in guesses]
    assert statuses == [401] * FREE_FAILURES
    assert (await sign_in(stack, "one-guess-too-many"))[0] == 429
    async with stack.http.get(stack.base + "/admin/", headers={
            "Authorization": "Bearer bearer-guess"}) as response:
        assert response.status == 429
        assert 1 <= int(response.headers["Retry-After"]) <= FIRST_DELAY
    assert (await sign_in(stack, ADMIN_TOKEN))[0] == 303
    async with stack.http.get(stack.base + "/admin/", headers={
            "Authorization": f"Bearer {ADMIN_TOKEN}"}) as response:
        assert response.status == 200
    lines = [r.getMessage() for r in caplog.records if r.name == "app.admin.site"]
    assert len(lines) == FREE_FAILURES
    assert all("127.0.0.1" in line for line in lines)
    assert not any(guess in line for guess in guesses for line in lines)


async def admin_sign_in_as(stack: Stack, token: str, forwarded: str) -> int:
    """POST the sign-in form as a client a proxy forwards (``X-Forwarded-For``)."""
    form = aiohttp.FormData({"token": token, "next": "/admin/"})
    async with stack.http.post(stack.base + "/admin/login", data=form, allow_redirects=False,
                               headers={"X-Forwarded-For": forwarded}) as response:
        await response.read()
        return response.status


async def test_behind_a_trusted_proxy_failures_count_per_forwarded_client(
        tmp_path: Path) -> None:
    """Behind a trusted proxy (every request comes from 127.0.0.1), an attacker's wrong tokens
    slow only the address the proxy forwards for them: the operator, forwarded from another
    address, is not throttled at all and signs in; so does the attacker's own right token."""
    async with started(tmp_path, trusted_proxies="127.0.0.1") as stack:
        attacker, operator = "203.0.113.9", "198.51.100.7"
        tries = [await admin_sign_in_as(stack, f"guess-{n}", attacker)
                 for n in range(FREE_FAILURES + 1)]
        operator_guess = await admin_sign_in_as(stack, "operator-typo", operator)
        operator_in = await admin_sign_in_as(stack, ADMIN_TOKEN, operator)
        attacker_right = await admin_sign_in_as(stack, ADMIN_TOKEN, attacker)
    assert tries == [401] * FREE_FAILURES + [429]
    assert (operator_guess, operator_in, attacker_right) == (401, 303, 303)


async def test_forwarded_addresses_from_an_untrusted_peer_are_ignored(tmp_path: Path) -> None:
    """Without the peer in GATEWAY_TRUSTED_PROXIES, a client that names a new address in
    X-Forwarded-For with every guess is still one client: throttled after the free failures."""
    async with started(tmp_path) as stack:
        tries = [await admin_sign_in_as(stack, f"guess-{n}", f"203.0.113.{n}")
                 for n in range(FREE_FAILURES + 1)]
    assert tries == [401] * FREE_FAILURES + [429]


async def test_signing_out_revokes_the_cookie_on_the_server(stack: Stack) -> None:
    """A copy of the login cookie kept after signing out (stolen, or the browser's old one) no
    longer opens a page: 200 before the sign-out, 401 after."""
    form = aiohttp.FormData({"token": ADMIN_TOKEN, "next": "/admin/"})
    async with stack.http.post(stack.base + "/admin/login", data=form,
                               allow_redirects=False) as response:
        cookie = response.cookies["gateway_admin"].value
    headers = {"Cookie": f"gateway_admin={cookie}"}
    async with aiohttp.ClientSession() as copy:
        async with copy.get(stack.base + "/admin/", headers=headers) as response:
            before = response.status
        async with copy.post(stack.base + "/admin/logout", headers=headers,
                             allow_redirects=False) as response:
            logout = response.status
        async with copy.get(stack.base + "/admin/", headers=headers) as response:
            after = response.status
    assert (before, logout, after) == (200, 303, 401)


def test_the_throttle_waits_longer_after_each_failure() -> None:
    """Free failures cost nothing; then each one doubles the wait from FIRST_DELAY up to
    MAX_DELAY; a success or an hour of quiet clears the client; other clients wait nothing."""
    now = [0.0]
    throttle = LoginThrottle(clock=lambda: now[0])
    waits = []
    for _ in range(FREE_FAILURES + 6):
        waits.append(throttle.wait("a"))
        throttle.failed("a")
    assert waits == [0.0] * FREE_FAILURES + [5.0, 10.0, 20.0, 40.0, 60.0, 60.0]
    assert throttle.wait("b") == 0.0
    now[0] += 59.0
    assert throttle.wait("a") == 1.0
    throttle.succeeded("a")
    assert throttle.wait("a") == 0.0
    throttle.failed("a")
    now[0] += FORGET + 1
    assert throttle.wait("a") == 0.0


NEXT_CASES = {
    "/admin/session/abc?tenant=t1": "/admin/session/abc?tenant=t1",
    "/admin/../../etc/passwd": "/admin/",
    "/admin/%2e%2e/%2e%2e/x": "/admin/",
    "/admin/x\r\nSet-Cookie: evil=1": "/admin/",
    "//evil.example/admin/": "/admin/",
    "https://evil.example/admin/": "/admin/",
    "/admin\\..\\x": "/admin/",
    "/adminx/": "/admin/",
    "": "/admin/",
}


async def test_next_after_sign_in_stays_under_admin(stack: Stack) -> None:
    """The page to go back to after signing in is normalised and kept only under /admin/; CR/LF
    or a climb out of /admin/ sends the browser to /admin/ (never a dropped connection)."""
    found = {}
    for given in NEXT_CASES:
        status, location = await sign_in(stack, ADMIN_TOKEN, given)
        found[given] = location if status == 303 else f"status {status}"
    assert found == NEXT_CASES


async def test_short_tokens_are_refused_at_start(tmp_path: Path) -> None:
    """GATEWAY_ADMIN_TOKEN under 32 random characters (short, or long but one letter
    repeated), the web or metrics token under 16: `gateway run` and `gateway viewer` exit 2 at
    once with one line naming the setting, never the token."""
    cases = [("GATEWAY_ADMIN_TOKEN", "run", "short-s3cret", "32 random characters"),
             ("GATEWAY_ADMIN_TOKEN", "viewer", "x" * 40, "32 random characters"),
             ("GATEWAY_ADMIN_TOKEN", "run", "abcd" * 10, "32 random characters"),
             ("GATEWAY_WEB_TOKEN", "run", "short-s3cret", "at least 16 characters"),
             ("GATEWAY_METRICS_TOKEN", "run", "short-s3cret", "at least 16 characters")]

    async def attempt(name: str, command: str, token: str) -> tuple[int | None, str]:
        env = {**os.environ, name: token, "GATEWAY_DATA_DIR": str(tmp_path),
               "GATEWAY_PORT": "0"}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", command, env=env, cwd=tmp_path,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        try:
            async with asyncio.timeout(60):  # a gateway that started would run until killed
                _, err = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return None, "still running"
        return proc.returncode, err.decode()

    results = await asyncio.gather(*(attempt(name, command, token)
                                     for name, command, token, _ in cases))
    assert [code for code, _ in results] == [2] * len(cases)
    for (name, _, token, said), (_, err) in zip(cases, results, strict=True):
        assert len(err.splitlines()) == 1, err
        assert name in err
        assert said in err
        assert token not in err
    assert Settings(_env_file=None, GATEWAY_ADMIN_TOKEN=ADMIN_TOKEN)  # type: ignore[call-arg]
