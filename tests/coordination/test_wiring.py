"""Wiring: GATEWAY_REDIS_URL picks the Redis coordinator; its settings are validated and its
URL is kept secret; a worker without a reachable Redis says so in one line."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from app.compose import build_coordinator, build_gateway
from app.compose_store import build_store
from app.config import Settings
from app.logs import RedactSecrets
from coordination.local import InProcessCoordinator
from coordination.redis_coordinator import RedisCoordinator
from gateway.edge.errors import ConfigError
from sessions.jsonl import JsonlSessionStore
from sessions.postgres.store import PostgresSessionStore

REDIS = "redis://:s3cretpass@redis.internal:6379/2"
STORE = "postgresql://gw@db.internal:5432/gateway"
ROOT = Path(__file__).resolve().parents[2]


def settings(tmp_path: Path, **values: Any) -> Settings:
    return Settings(_env_file=None, GATEWAY_DATA_DIR=str(tmp_path), **values)  # type: ignore[call-arg]  # pydantic-settings init


async def test_redis_url_selects_the_redis_coordinator(tmp_path: Path) -> None:
    """GATEWAY_REDIS_URL picks the Redis coordinator (prefix, ttl from settings, URL hidden)."""
    chosen = build_coordinator(settings(tmp_path, GATEWAY_REDIS_URL=REDIS,
                                        GATEWAY_STORE_URL=STORE, GATEWAY_REDIS_PREFIX="gwx:",
                                        GATEWAY_LEASE_TTL=5))
    assert isinstance(chosen, RedisCoordinator)
    assert (chosen.keys.prefix, chosen.lease_ttl) == ("gwx:", 5.0)
    assert "s3cretpass" not in repr(chosen)
    await chosen.aclose()  # never connected: closing is still fine
    assert isinstance(build_coordinator(settings(tmp_path)), InProcessCoordinator)


def test_redis_needs_the_shared_store(tmp_path: Path) -> None:
    """Several workers need PostgreSQL (fencing): Redis with JSONL files is refused."""
    with pytest.raises(ConfigError, match="GATEWAY_STORE_URL"):
        build_coordinator(settings(tmp_path, GATEWAY_REDIS_URL=REDIS))
    with pytest.raises(ConfigError, match="fencing"):
        build_gateway(settings(tmp_path, GATEWAY_REDIS_URL=REDIS, GATEWAY_STORE_URL=STORE),
                      store=JsonlSessionStore(tmp_path / "d"))


def test_settings_are_validated_and_the_url_kept_secret(tmp_path: Path) -> None:
    """Redis settings are checked, the URL never echoed or logged; the schema reaches the store."""
    with pytest.raises(ValidationError) as info:
        settings(tmp_path, GATEWAY_REDIS_URL="http://:s3cretpass@x/")
    assert "GATEWAY_REDIS_URL" in str(info.value)
    assert "s3cretpass" not in str(info.value)
    with pytest.raises(ValidationError):
        settings(tmp_path, GATEWAY_LEASE_TTL=31)
    with pytest.raises(ValidationError):
        settings(tmp_path, GATEWAY_STORE_SCHEMA="gw-test")
    chosen = settings(tmp_path, GATEWAY_REDIS_URL=REDIS, GATEWAY_STORE_URL=STORE,
                      GATEWAY_STORE_SCHEMA="gw_test_x")
    assert chosen.lease_ttl <= 30
    assert "s3cretpass" not in repr(chosen)
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "auth: %s", ("s3cretpass",), None)
    RedactSecrets(chosen.secrets()).filter(record)
    assert record.getMessage() == "auth: ***"
    store = build_store(chosen)
    assert isinstance(store, PostgresSessionStore)
    assert store.schema == "gw_test_x"


async def test_run_without_reachable_redis_is_one_line(tmp_path: Path) -> None:
    """`gateway run` without a reachable Redis exits 2 with one line, never showing the URL."""
    env = {**os.environ, "GATEWAY_CHANNELS": "web", "GATEWAY_PORT": "0",
           "GATEWAY_DATA_DIR": str(tmp_path), "GATEWAY_STORE_URL": STORE,
           "GATEWAY_REDIS_URL": "redis://:s3cretpass@127.0.0.1:1/0", "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "run", cwd=tmp_path, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert err.decode().strip().splitlines()[-1] == (
        "gateway run: cannot reach Redis at GATEWAY_REDIS_URL (ConnectionError)")
    assert b"s3cretpass" not in out + err
