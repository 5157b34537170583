"""Engine fixtures for the storage tests: memory, LMDB (real files) and a real PostgreSQL.

``postgres_dsn`` (session) starts a throwaway cluster (see :mod:`tests.storage.pg`) or uses
``MYCELIA_TEST_DSN``; without PostgreSQL the tests that need it are skipped with the
reason, or fail under ``MYCELIA_REQUIRE_POSTGRES=1``. Each PostgreSQL engine gets its own
schema, dropped when the test ends.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mycelia.storage import MemoryStorage, StorageEngine
from mycelia.storage.lmdb import LmdbStorage
from mycelia.storage.testing import EngineSpec
from tests.storage.pg import PostgresUnavailable, postgres_dsn

ENGINES = ["memory", "lmdb", "postgres"]


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """A PostgreSQL DSN for the whole session (skip or fail loudly when there is none)."""
    try:
        with postgres_dsn() as dsn:
            yield dsn
    except PostgresUnavailable as exc:
        message = f"PostgreSQL tests need a server: {exc}"
        if os.environ.get("MYCELIA_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"{message} (and MYCELIA_REQUIRE_POSTGRES=1)")
        pytest.skip(message)


def memory_spec() -> EngineSpec:
    async def fresh() -> StorageEngine:
        return MemoryStorage()

    return EngineSpec("memory", fresh)


def lmdb_spec(root: Path, *, durable: bool = False, map_size: int = 1 << 20) -> EngineSpec:
    """Fresh LMDB stores under ``root`` (small maps, so growth is exercised too)."""
    counter = itertools.count()
    paths: dict[int, Path] = {}

    async def fresh() -> StorageEngine:
        path = root / f"store{next(counter)}"
        engine = LmdbStorage(path, durable=durable, map_size=map_size)
        paths[id(engine)] = path
        return engine

    async def reopen(engine: StorageEngine) -> StorageEngine:
        path = paths.pop(id(engine))
        await engine.close()
        again = LmdbStorage(path, durable=durable, map_size=map_size)
        paths[id(again)] = path
        return again

    return EngineSpec("lmdb", fresh, reopen)


class PostgresSchemas:
    """Hands out PostgreSQL engines, each on a fresh schema, and drops them at the end."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.schemas: list[str] = []

    def new_schema(self) -> str:
        schema = f"t_{uuid.uuid4().hex[:16]}"
        self.schemas.append(schema)
        return schema

    def spec(self) -> EngineSpec:
        from mycelia.storage.postgres import PostgresStorage  # noqa: PLC0415 - optional driver

        schemas: dict[int, str] = {}

        async def fresh() -> StorageEngine:
            engine = await PostgresStorage(self.dsn, schema=self.new_schema()).open()
            schemas[id(engine)] = engine.schema
            return engine

        async def reopen(engine: StorageEngine) -> StorageEngine:
            schema = schemas.pop(id(engine))
            await engine.close()
            again = await PostgresStorage(self.dsn, schema=schema).open()
            schemas[id(again)] = schema
            return again

        return EngineSpec("postgres", fresh, reopen)

    def drop_all(self) -> None:
        import psycopg  # noqa: PLC0415 - optional driver
        from psycopg import sql  # noqa: PLC0415

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for schema in self.schemas:
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
                )


@pytest.fixture
def pg_schemas(pg_dsn: str) -> Iterator[PostgresSchemas]:
    """Fresh schemas on the session's PostgreSQL, dropped after the test (a sync fixture,
    so async tests can ask for it through ``request.getfixturevalue``)."""
    schemas = PostgresSchemas(pg_dsn)
    yield schemas
    schemas.drop_all()


@pytest.fixture(params=ENGINES)
def engine_spec(request: pytest.FixtureRequest, tmp_path: Path) -> EngineSpec:
    """One engine kind per test (the PostgreSQL one skips without a server)."""
    if request.param == "memory":
        return memory_spec()
    if request.param == "lmdb":
        return lmdb_spec(tmp_path)
    schemas: PostgresSchemas = request.getfixturevalue("pg_schemas")
    return schemas.spec()
