"""GATEWAY_STORE_URL: store selection in the composition root, validation, secret handling."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from app.compose_store import build_store
from app.config import Settings
from app.logs import RedactSecrets
from sessions.jsonl import JsonlSessionStore
from sessions.postgres.store import PostgresSessionStore

URL = "postgresql://gw:hunter2secret@db.internal:5432/gateway"


def settings(tmp_path: Path, **values: Any) -> Settings:
    return Settings(_env_file=None, GATEWAY_DATA_DIR=str(tmp_path), **values)  # type: ignore[call-arg]  # pydantic-settings init


async def test_store_url_selects_postgres(tmp_path: Path) -> None:
    """With GATEWAY_STORE_URL the gateway's store is PostgreSQL; without it, JSONL files."""
    pg = build_store(settings(tmp_path, GATEWAY_STORE_URL=URL))
    files = build_store(settings(tmp_path))
    empty = build_store(settings(tmp_path, GATEWAY_STORE_URL=""))
    assert (type(pg), type(files), type(empty)) == (
        PostgresSessionStore, JsonlSessionStore, JsonlSessionStore)
    assert "hunter2secret" not in repr(pg)
    await pg.aclose()  # never connected: nothing to close, and no error


def test_store_url_is_kept_secret(tmp_path: Path) -> None:
    """The URL never shows in the settings' repr, and its password is redacted from logs."""
    chosen = settings(tmp_path, GATEWAY_STORE_URL=URL)
    assert "hunter2secret" not in repr(chosen)
    assert "hunter2secret" in chosen.secrets()
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "auth failed: %s",
                               ("hunter2secret",), None)
    RedactSecrets(chosen.secrets()).filter(record)
    assert record.getMessage() == "auth failed: ***"


def test_store_url_must_be_postgres_and_is_not_echoed(tmp_path: Path) -> None:
    """Another scheme is refused; the error names the setting, never the value."""
    with pytest.raises(ValidationError) as info:
        settings(tmp_path, GATEWAY_STORE_URL="mysql://gw:hunter2secret@db/gateway")
    assert "GATEWAY_STORE_URL" in str(info.value)
    assert "hunter2secret" not in str(info.value)
