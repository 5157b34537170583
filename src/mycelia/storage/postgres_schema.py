"""The PostgreSQL engine's schema on the server: created, migrated, or checked (ARCHITECTURE.md
§6; the statements are :data:`~mycelia.storage.postgres_sql.MIGRATIONS`).

Invariants:

- Creating and migrating run in one transaction under a transaction-level advisory lock
  on the schema's name (:func:`lock_key`), so processes starting together do not race
  the DDL: the first migrates, the others then find it done.
- A schema at a newer version than this engine knows is refused (StorageError), never
  migrated down or written.
- :func:`check_schema` (an open that may not create: ``inspect``, ``dump``) creates and
  migrates nothing: a missing store is StorageNotFound, one at another version
  StorageReadOnly.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql

from mycelia.errors import StorageError, StorageNotFound, StorageReadOnly
from mycelia.storage.engine import decode_values
from mycelia.storage.plan import index_entries
from mycelia.storage.postgres_sql import (
    FIELD_KEYS_VERSION,
    MIGRATIONS,
    SCHEMA_VERSION,
    key_columns,
)

__all__ = ["check_schema", "lock_key", "migrate"]

log = logging.getLogger(__name__)


def lock_key(name: str) -> int:
    """An advisory lock key (a signed 64-bit integer) for ``name``."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


async def migrate(
    conn: psycopg.AsyncConnection[Any], schema: str, queries: Mapping[str, sql.Composed]
) -> None:
    """Create ``schema`` or bring it to :data:`SCHEMA_VERSION`, in one transaction."""
    s = sql.Identifier(schema)
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(f"mycelia:{schema}"),))
        await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(s))
        await conn.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {}.version (version int NOT NULL)").format(s)
        )
        row = await (
            await conn.execute(sql.SQL("SELECT max(version) FROM {}.version").format(s))
        ).fetchone()
        current = (row[0] if row else None) or 0
        if current > SCHEMA_VERSION:
            raise StorageError(
                f"schema {schema} is at version {current}; this engine knows up to {SCHEMA_VERSION}"
            )
        for version in range(current + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[version - 1]:
                await conn.execute(sql.SQL(statement).format(s=s))
            if version == FIELD_KEYS_VERSION:
                await _index_every_state(conn, queries)
            await conn.execute(sql.SQL("DELETE FROM {}.version").format(s))
            await conn.execute(sql.SQL("INSERT INTO {}.version VALUES (%s)").format(s), (version,))
            log.info("migrated PostgreSQL schema %s to version %d", schema, version)


async def check_schema(conn: psycopg.AsyncConnection[Any], schema: str) -> None:
    """The schema must exist at :data:`SCHEMA_VERSION`; nothing is created."""
    found = await (
        await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f'"{schema}".version',))
    ).fetchone()
    if not (found and found[0]):
        raise StorageNotFound(
            f"there is no Mycelia store in PostgreSQL schema {schema}: "
            "give the schema of a store (nothing was created)"
        )
    row = await (
        await conn.execute(
            sql.SQL("SELECT max(version) FROM {}.version").format(sql.Identifier(schema))
        )
    ).fetchone()
    version = row[0] if row else None
    if version != SCHEMA_VERSION:
        raise StorageReadOnly(
            f"schema {schema} is at version {version}, not "
            f"{SCHEMA_VERSION}: open it writable once to migrate it"
        )


async def _index_every_state(
    conn: psycopg.AsyncConnection[Any], queries: Mapping[str, sql.Composed]
) -> None:
    """Fill ``field_keys`` from the stored states (the data step of migration 2)."""
    async with conn.cursor("mycelia_migrate", binary=True) as cursor:
        await cursor.execute(queries["all_values"])
        while rows := await cursor.fetchmany(1000):
            keys = [(e, c, index_entries(decode_values(raw))) for e, c, raw in rows]
            await conn.execute(queries["insert_keys"], key_columns(keys))
