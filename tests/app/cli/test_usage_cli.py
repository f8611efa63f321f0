"""``gateway usage`` and the live accounting: costs recorded per call, counted in /metrics,
added up by the CLI (real Anthropic SDK against the local fake, web channel)."""

from __future__ import annotations

import asyncio
import csv
import io
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from app.cli import main
from app.compose import build_gateway
from app.config import Settings
from providers.anthropic import AnthropicProvider
from sessions.jsonl import JsonlSessionStore
from sessions.pricing import DEFAULT_PRICES
from tests.fakes.providers import FakeProviderServer
from tests.web_ids import client_label

MODEL = "claude-sonnet-4-5"
SONNET = DEFAULT_PRICES["claude-sonnet-4"]
LONG = "please remember all of this: " + "lorem ipsum dolor sit amet " * 250


@dataclass(frozen=True)
class Recorded:
    data: Path
    outcomes: list[dict[str, Any]]  # every outcome entry of every log, as written
    metrics: str


async def _record(tmp_path: Path) -> Recorded:
    data = tmp_path / "data"
    # Every entry stamped with the moment the recording began: on the wall clock, calls that
    # straddled a UTC midnight made two rows of --by day. (--since 1d still reads the real
    # clock: these calls are a moment old.)
    started = time.time()
    async with FakeProviderServer() as srv:
        provider = AnthropicProvider("k", MODEL, base_url=srv.anthropic_base_url, max_retries=0)
        settings = Settings(_env_file=None, GATEWAY_DATA_DIR=str(data), GATEWAY_PORT=0,
                            GATEWAY_WEB_TENANT="web")
        store = JsonlSessionStore(data, clock=lambda: started)
        gateway = build_gateway(settings, store=store, provider=provider)
        await gateway.start()
        base = f"http://127.0.0.1:{gateway.bound_port}"
        try:
            # Two browsers (each keeps the identity cookie the chat page sets): the person of
            # conversation a, and the person of conversation b.
            async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as one, \
                    aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as two:
                for http in (one, two):
                    async with http.get(f"{base}/") as response:
                        assert response.status == 200
                for http, conversation, text in [(one, "a", LONG), (one, "a", "and again"),
                                                 (two, "b", "hello")]:
                    async with http.post(f"{base}/api/chat", json={
                            "conversation": conversation, "text": text}) as response:
                        assert response.status == 200, await response.text()
                async with one.get(f"{base}/metrics") as response:
                    metrics = await response.text()
        finally:
            await gateway.aclose()
    outcomes = [orjson.loads(line) for path in sorted(data.rglob("*.jsonl"))
                for line in path.read_bytes().splitlines() if b'"outcome"' in line]
    return Recorded(data, [o for o in outcomes if o["type"] == "outcome"], metrics)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    return asyncio.run(_record(tmp_path_factory.mktemp("usage")))


@dataclass(frozen=True)
class Result:
    code: int | str | None
    out: str
    err: str


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], recorded: Recorded) -> Callable[..., Result]:
    def run(*argv: str) -> Result:
        try:
            code: int | str | None = main(["usage", "--data-dir", str(recorded.data), *argv])
        except SystemExit as exc:
            code = exc.code
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return run


def price_of(usage: dict[str, int]) -> float:
    """The documented formula, written out here independently of sessions.pricing."""
    return (usage.get("input_tokens", 0) * 3.0 + usage.get("output_tokens", 0) * 15.0
            + usage.get("cache_creation_input_tokens", 0) * 3.75
            + usage.get("cache_read_input_tokens", 0) * 0.30) / 1e6


def test_each_outcome_records_its_cost(recorded: Recorded) -> None:
    """Every call's outcome holds the cost of its usage at the model's price; the repeated
    long prefix of conversation a was read from the cache."""
    assert len(recorded.outcomes) == 3
    for outcome in recorded.outcomes:
        assert outcome["cost_usd"] == pytest.approx(price_of(outcome["usage"]), abs=1e-9)
    assert any(o["usage"].get("cache_read_input_tokens", 0) > 1000 for o in recorded.outcomes)


def sample(metrics: str, family: str, **labels: str) -> float:
    """Sum of a metric family's samples whose labels include ``labels``."""
    total = 0.0
    for line in metrics.splitlines():
        match = re.match(rf"{family}\{{(.*)\}} (\S+)$", line)
        if match and all(f'{k}="{v}"' in match.group(1) for k, v in labels.items()):
            total += float(match.group(2))
    return total


def test_metrics_count_tokens_and_cost(recorded: Recorded) -> None:
    """/metrics counts tokens by kind and dollars, by provider, model and tenant."""
    labels = {"provider": "anthropic", "model": MODEL, "tenant": "web"}
    for key, kind in [("input_tokens", "input"), ("output_tokens", "output"),
                      ("cache_read_input_tokens", "cache_read"),
                      ("cache_creation_input_tokens", "cache_write")]:
        expected = sum(o["usage"].get(key, 0) for o in recorded.outcomes)
        assert sample(recorded.metrics, "gateway_tokens_total", kind=kind, **labels) == expected
    assert sample(recorded.metrics, "gateway_cost_usd_total", **labels) == pytest.approx(
        sum(o["cost_usd"] for o in recorded.outcomes))


def web_key(key: str) -> str:
    tenant, _, label = key.partition("/")
    return f"{tenant}/{client_label(label)}"


def test_json_by_conversation_adds_up_the_outcomes(
        cli: Callable[..., Result], recorded: Recorded) -> None:
    """--format json: one row per conversation, totals equal to the outcomes' sums."""
    result = cli("--format", "json")
    assert result.code == 0, result.err
    doc = orjson.loads(result.out)
    # (each conversation as the client named it: the gateway keys it under the person)
    assert sorted((web_key(r["key"]), r["calls"]) for r in doc["rows"]) == [
        ("web/web:a", 2), ("web/web:b", 1)]
    whole = doc["total"]
    assert whole["cost_usd"] == pytest.approx(sum(o["cost_usd"] for o in recorded.outcomes),
                                              abs=1e-6)
    assert whole["cache_read_tokens"] == sum(
        o["usage"].get("cache_read_input_tokens", 0) for o in recorded.outcomes)
    assert whole["unpriced_calls"] == 0


def test_by_user_model_and_filters(cli: Callable[..., Result]) -> None:
    """--by user names the web people (each browser is its own person, by the identity the
    server gave it); --user and --since filter; a future --since is empty."""
    by_user = orjson.loads(cli("--by", "user", "--format", "json").out)
    rows = sorted((r["calls"], r["key"]) for r in by_user["rows"])
    assert [calls for calls, _ in rows] == [1, 2]
    assert all(key.startswith("web/web:c-") for _, key in rows)
    first = rows[1][1].removeprefix("web/")
    assert orjson.loads(cli("--user", first, "--format", "json").out)["total"]["calls"] == 2
    assert orjson.loads(cli("--user", "web:nobody", "--format", "json").out)["rows"] == []
    assert orjson.loads(cli("--since", "1d", "--format", "json").out)["total"]["calls"] == 3
    assert cli("--since", "2099-01-01").out == "no provider calls (since 2099-01-01 00:00 UTC)\n"
    assert [r["key"] for r in orjson.loads(cli("--by", "model", "--format", "json").out)[
        "rows"]] == [MODEL]


def test_table_and_csv(cli: Callable[..., Result]) -> None:
    """The table ends with a total under a rule; CSV has a header and one line per row."""
    table = cli("--by", "tenant").out.splitlines()
    assert table[0] == "usage by tenant, all time"
    assert table[1].split()[:3] == ["tenant", "calls", "input"]
    assert table[2].split()[:2] == ["web", "3"]
    assert set(table[3]) == {"-", " "}
    assert table[4].split()[:2] == ["total", "3"]
    rows = list(csv.reader(io.StringIO(cli("--format", "csv", "--by", "day").out)))
    assert rows[0][:3] == ["day", "calls", "sessions"]
    assert len(rows) == 2
    assert rows[1][1:3] == ["3", "2"]


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--since", "last week"], {}, "--since 'last week'"),
        (["--by", "color"], {}, "invalid choice"),
        ([], {"GATEWAY_PRICES_FILE": "/nonexistent/prices.toml"}, "GATEWAY_PRICES_FILE"),
    ],
)
def test_usage_errors_are_one_line_exit_2(
    cli: Callable[..., Result], monkeypatch: pytest.MonkeyPatch, argv: list[str],
    env: dict[str, str], message: str,
) -> None:
    """A bad --since, --by or price file: one line on stderr, exit 2."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = cli(*argv)
    assert result.code == 2
    assert result.out == ""
    assert len(result.err.splitlines()) == 1
    assert message in result.err
