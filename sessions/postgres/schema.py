"""The versioned schema of the PostgreSQL session store, and the migrations that build it.

Everything lives in one PostgreSQL schema (default ``gateway``), so several deployments, or
the test suite's throw-away schemas, can share a database. Tables::

    schema_version(version PK, description, applied_at)     one row per applied migration
    sessions(tenant, id PK, started_at, channel, conversation, version, header jsonb,
             fence, next_seq, message_count, first_user_text, size_bytes, created_at,
             modified_at)
    entries(tenant, session_id, seq PK, type, line bytea)   one row per log line
    blobs(tenant, hash PK, size, data bytea, stored_at)     attachment bytes by sha256
    erasures(id PK, tenant, ts, line bytea)                 one tombstone per erasure (v3)
    inbox(id PK, tenant, conversation, item, dedup, body, attempts, session_id,
          received_at, answered_at)                         owed messages of workers (v4)
    fences                                                  sequence of fencing tokens (v4)
    schedules(tenant, id PK, owner, state, next_at, firing, held_until, target_channel,
              target_person, created_at, body)              scheduled turns (v5)
    schedule_zones(tenant, person PK, zone)                 people's time zones (v5)

``entries.line`` holds the exact bytes of one JSONL line (no newline); the log of a session is
its lines in ``seq`` order, each followed by ``\\n``. ``sessions.fence`` is the writer's fencing
token (taken from the ``fences`` sequence) and ``next_seq`` the seq the next append must start
at; both are checked by
``append_entries()``, the one function every append goes through (see
:mod:`sessions.postgres.store`).

:func:`upgrade` applies pending migrations in order, in one transaction, holding a
transaction-scoped advisory lock keyed by the schema name, so workers started together do not
race (the second waits, then finds nothing left to do). A store refuses to run on any other
version than :data:`LATEST` (:func:`check`): the error says to run ``gateway db upgrade``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, TypeAlias

from sessions.errors import SessionError

if TYPE_CHECKING:
    import asyncpg
    from asyncpg.pool import PoolConnectionProxy

    Connection: TypeAlias = (
        "asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]"
    )

DEFAULT_SCHEMA = "gateway"
SCHEMA_PATTERN = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class SchemaVersionError(SessionError):
    """The database schema is not the version this code needs (older, newer or missing)."""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    description: str
    sql: str


_V1 = """
CREATE TABLE {schema}.sessions (
    tenant          text        NOT NULL,
    id              text        NOT NULL,
    started_at      text,
    channel         text,
    conversation    text,
    version         integer,
    header          jsonb       NOT NULL,
    fence           bigint      NOT NULL DEFAULT 0,
    next_seq        bigint      NOT NULL DEFAULT 0 CHECK (next_seq >= 0),
    message_count   bigint      NOT NULL DEFAULT 0,
    first_user_text text,
    size_bytes      bigint      NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    modified_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, id)
);
-- latest_session(): newest session of a conversation, ordered like the JSONL store (by code
-- point, hence COLLATE "C").
CREATE INDEX sessions_by_conversation ON {schema}.sessions
    (tenant, conversation, started_at COLLATE "C" DESC, id COLLATE "C" DESC);

CREATE TABLE {schema}.entries (
    tenant     text   NOT NULL,
    session_id text   NOT NULL,
    seq        bigint NOT NULL CHECK (seq >= 0),
    type       text,
    -- One JSONL line, byte for byte; a newline inside would break the log's framing.
    line       bytea  NOT NULL CHECK (position('\\x0a'::bytea IN line) = 0),
    PRIMARY KEY (tenant, session_id, seq),
    FOREIGN KEY (tenant, session_id) REFERENCES {schema}.sessions (tenant, id)
        ON DELETE CASCADE
);
CREATE INDEX entries_messages ON {schema}.entries (tenant, session_id, seq)
    WHERE type = 'message';

-- The only way appends are written. In one statement (so one transaction): lock the session
-- row, check the writer's fence and that the batch starts right after the last stored seq
-- (no gap, no duplicate), insert the lines and advance the counters. A failed check writes
-- nothing and says why; the caller turns that into StaleWriterError or SEQ_CONFLICT.
CREATE FUNCTION {schema}.append_entries(
    p_tenant text, p_session text, p_fence bigint, p_first_seq bigint,
    p_types text[], p_lines bytea[], p_messages bigint, p_first_user_text text
) RETURNS TABLE (status text, cur_fence bigint, cur_next bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    s_fence bigint;
    s_next  bigint;
    s_last  bigint;
    n       bigint := cardinality(p_lines);
BEGIN
    SELECT s.fence, s.next_seq INTO s_fence, s_next
      FROM {schema}.sessions s
     WHERE s.tenant = p_tenant AND s.id = p_session
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'missing'::text, NULL::bigint, NULL::bigint;
        RETURN;
    END IF;
    IF s_fence <> p_fence THEN
        RETURN QUERY SELECT 'stale'::text, s_fence, s_next;
        RETURN;
    END IF;
    SELECT max(e.seq) INTO s_last
      FROM {schema}.entries e
     WHERE e.tenant = p_tenant AND e.session_id = p_session;
    s_last := coalesce(s_last, -1);
    IF s_next <> p_first_seq OR s_last <> p_first_seq - 1 THEN
        RETURN QUERY SELECT 'seq'::text, s_fence, greatest(s_next, s_last + 1);
        RETURN;
    END IF;
    INSERT INTO {schema}.entries (tenant, session_id, seq, type, line)
    SELECT p_tenant, p_session, p_first_seq + u.ord - 1, u.kind, u.body
      FROM unnest(p_types, p_lines) WITH ORDINALITY AS u(kind, body, ord);
    UPDATE {schema}.sessions s
       SET next_seq = p_first_seq + n,
           message_count = s.message_count + p_messages,
           size_bytes = s.size_bytes
               + (SELECT coalesce(sum(octet_length(b) + 1), 0) FROM unnest(p_lines) AS b),
           first_user_text = coalesce(s.first_user_text, p_first_user_text),
           modified_at = now()
     WHERE s.tenant = p_tenant AND s.id = p_session;
    RETURN QUERY SELECT 'ok'::text, s_fence, p_first_seq + n;
END
$fn$;
"""

# Attachment bytes, content-addressed per tenant (sessions.postgres.blobs). Images, PDFs and
# audio are compressed already: EXTERNAL storage keeps them out of line without compressing
# them again.
_V2 = """
CREATE TABLE {schema}.blobs (
    tenant    text        NOT NULL,
    hash      text        NOT NULL CHECK (hash ~ '^[0-9a-f]{64}$'),
    size      bigint      NOT NULL CHECK (size >= 0),
    data      bytea       NOT NULL CHECK (octet_length(data) = size),
    stored_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, hash)
);
ALTER TABLE {schema}.blobs ALTER COLUMN data SET STORAGE EXTERNAL;
"""

_V3 = """
-- Tombstones (sessions.tombstones): what stays of an erased person's sessions. The line is the
-- exact JSON the JSONL store keeps in erasures.jsonl.
CREATE TABLE {schema}.erasures (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant  text        NOT NULL,
    ts      timestamptz NOT NULL DEFAULT now(),
    line    bytea       NOT NULL CHECK (position('\\x0a'::bytea IN line) = 0)
);
CREATE INDEX erasures_by_tenant ON {schema}.erasures (tenant, id);
"""

_V4 = """
-- Fencing tokens (sessions.postgres.store): every writer's token comes from this sequence, so
-- a token is never given twice and never goes back, whatever happens to Redis. It starts past
-- every fence stored so far.
CREATE SEQUENCE {schema}.fences AS bigint;
SELECT setval('{schema}.fences',
              (SELECT coalesce(max(fence), 0) + 1 FROM {schema}.sessions), false);

-- The owed messages of workers sharing this store (sessions.postgres.inbox): a row from the
-- moment a message is acknowledged until its answer went out. The queue order of a
-- conversation is ``id``; ``dedup`` (the platform id, per tenant) refuses a redelivery.
CREATE TABLE {schema}.inbox (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant       text        NOT NULL,
    conversation text        NOT NULL,
    item         text        NOT NULL UNIQUE,
    dedup        text,
    body         text        NOT NULL,
    attempts     integer     NOT NULL DEFAULT 0,
    session_id   text,
    received_at  timestamptz NOT NULL DEFAULT now(),
    answered_at  timestamptz
);
CREATE UNIQUE INDEX inbox_dedup ON {schema}.inbox (tenant, dedup) WHERE dedup IS NOT NULL;
-- What is owed, per conversation, in order: the only rows a start or a sweep reads.
CREATE INDEX inbox_owed ON {schema}.inbox (tenant, conversation, id) WHERE answered_at IS NULL;
CREATE INDEX inbox_answered ON {schema}.inbox (answered_at) WHERE answered_at IS NOT NULL;
"""

_V5 = """
-- Schedules (sessions.postgres.schedules): the whole record in ``body`` (the JSON the JSONL
-- store keeps), and the columns the firing steps and the limits query. ``next_at``, ``firing``
-- and ``held_until`` are Unix seconds. ``target_person`` is whom a one-to-one target is with
-- (erasure); NULL for a group.
CREATE TABLE {schema}.schedules (
    tenant         text             NOT NULL,
    id             text             NOT NULL,
    owner          text             NOT NULL,
    state          text             NOT NULL CHECK (state IN ('active', 'done', 'cancelled')),
    next_at        double precision,
    firing         double precision,
    held_until     double precision,
    target_channel text             NOT NULL,
    target_person  text,
    created_at     double precision NOT NULL,
    body           text             NOT NULL,
    PRIMARY KEY (tenant, id)
);
-- Step 1 of a firing reads only these: active, nothing claimed, by due time.
CREATE INDEX schedules_due ON {schema}.schedules (next_at)
    WHERE state = 'active' AND firing IS NULL;
-- Step 2: the claimed occurrences.
CREATE INDEX schedules_firing ON {schema}.schedules (firing) WHERE firing IS NOT NULL;
CREATE INDEX schedules_owner ON {schema}.schedules (tenant, owner) WHERE state = 'active';
CREATE INDEX schedules_person ON {schema}.schedules (tenant, target_channel, target_person);

-- A person's time zone for their schedules (person: CHANNEL:ID).
CREATE TABLE {schema}.schedule_zones (
    tenant text NOT NULL,
    person text NOT NULL,
    zone   text NOT NULL,
    PRIMARY KEY (tenant, person)
);
"""

_V6 = """
-- Retention (sessions.retention): the sessions whose last entry is older than a cutoff, found
-- without reading the others (the hourly pass of a running gateway).
CREATE INDEX sessions_by_modified ON {schema}.sessions (modified_at);
"""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "sessions, entries, append_entries()", _V1),
    Migration(2, "blobs (attachment bytes by sha256)", _V2),
    Migration(3, "erasures (tombstones)", _V3),
    Migration(4, "fencing-token sequence, inbox (owed messages of shared workers)", _V4),
    Migration(5, "schedules, schedule_zones (scheduled turns)", _V5),
    Migration(6, "sessions by last modification (retention)", _V6),
)
LATEST = MIGRATIONS[-1].version


def validate_schema(name: str) -> str:
    """A schema name is a plain lower-case identifier; anything else is refused."""
    if SCHEMA_PATTERN.fullmatch(name) is None:
        raise ValueError(f"schema name {name[:70]!r} is not a plain identifier ([a-z_][a-z0-9_]*)")
    return name


def quoted(schema: str) -> str:
    """The schema as a quoted SQL identifier (validated, so it needs no escaping)."""
    return f'"{validate_schema(schema)}"'


def render(sql: str, schema: str) -> str:
    return sql.replace("{schema}", quoted(schema))


def _lock_key(schema: str) -> str:
    return f"gateway.migrations:{schema}"


async def current_version(conn: Connection, schema: str) -> int:
    """The schema's version: 0 when it has never been migrated."""
    table = await conn.fetchval("SELECT to_regclass($1)", f"{quoted(schema)}.schema_version")
    if table is None:
        return 0
    version = await conn.fetchval(f"SELECT max(version) FROM {quoted(schema)}.schema_version")
    return int(version or 0)


async def applied(conn: Connection, schema: str) -> list[tuple[int, str, datetime]]:
    """Applied migrations, oldest first: (version, description, applied_at)."""
    if await current_version(conn, schema) == 0:
        return []
    rows = await conn.fetch(
        f"SELECT version, description, applied_at FROM {quoted(schema)}.schema_version "
        "ORDER BY version"
    )
    return [(int(r["version"]), str(r["description"]), r["applied_at"]) for r in rows]


async def upgrade(conn: Connection, schema: str = DEFAULT_SCHEMA) -> tuple[int, int]:
    """Apply every pending migration; return (version before, version after). Idempotent."""
    q = quoted(schema)
    async with conn.transaction():
        # Held until commit: a second worker waits here, then sees the new version.
        await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                           _lock_key(schema))
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {q}")
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {q}.schema_version ("
            " version integer PRIMARY KEY, description text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        before = await current_version(conn, schema)
        if before > LATEST:
            raise SchemaVersionError(_newer(schema, before))
        for migration in MIGRATIONS:
            if migration.version <= before:
                continue
            await conn.execute(render(migration.sql, schema))
            await conn.execute(
                f"INSERT INTO {q}.schema_version (version, description) VALUES ($1, $2)",
                migration.version, migration.description,
            )
    return before, LATEST


async def check(conn: Connection, schema: str) -> None:
    """Raise :class:`SchemaVersionError` unless the schema is exactly at :data:`LATEST`."""
    version = await current_version(conn, schema)
    if version > LATEST:
        raise SchemaVersionError(_newer(schema, version))
    if version < LATEST:
        state = "has no session tables" if version == 0 else f"is at version {version}"
        raise SchemaVersionError(
            f"session database schema {schema!r} {state}; this gateway needs version {LATEST}: "
            "run `gateway db upgrade`"
        )


def _newer(schema: str, version: int) -> str:
    return (
        f"session database schema {schema!r} is at version {version}, newer than this gateway "
        f"knows ({LATEST}); upgrade the gateway"
    )
