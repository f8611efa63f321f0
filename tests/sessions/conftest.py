"""Store fixtures: ``store`` runs a test once per backend (JSONL files, PostgreSQL).

``jsonl_store`` lives in ``tmp_path/data``; ``pg_store`` in a migrated schema of its own that is
dropped after the test (see :mod:`tests.sessions.pg`). A module may still define its own
``store`` fixture (``test_store.py`` does, for the JSONL-only tests); a test can also pin one
backend with ``@pytest.mark.parametrize("store", ["postgres"], indirect=True)``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sessions.jsonl import JsonlSessionStore
from sessions.postgres.store import PostgresSessionStore
from sessions.store import SessionStore
from tests.sessions.pg import PG_URL, fresh_schema

BACKENDS = ["jsonl", pytest.param("postgres", marks=pytest.mark.services)]


@pytest.fixture
def jsonl_store(tmp_path: Path) -> JsonlSessionStore:
    return JsonlSessionStore(tmp_path / "data", durability="none")


@pytest.fixture
async def pg_schema_name() -> AsyncIterator[str]:
    async with fresh_schema() as name:
        yield name


@pytest.fixture
async def pg_store(pg_schema_name: str) -> AsyncIterator[PostgresSessionStore]:
    store = await PostgresSessionStore.connect(PG_URL, schema=pg_schema_name)
    try:
        yield store
    finally:
        await store.aclose()


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest) -> SessionStore:
    fixture = {"jsonl": "jsonl_store", "postgres": "pg_store"}[request.param]
    found: SessionStore = request.getfixturevalue(fixture)
    return found
