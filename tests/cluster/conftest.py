"""Fixtures for the cluster tests: several nodes (or server processes) on one PostgreSQL.

The PostgreSQL fixtures are the storage tests' (``tests/storage/conftest.py``): a
throwaway cluster for the session, a fresh schema per test, dropped at its end.

``pair`` is two durable nodes in this process on one such schema, each with its own engine
(:func:`tests.cluster.nodes.open_pair`), closed when the test ends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from mycelia import Node
from tests.cluster.nodes import open_pair
from tests.storage.conftest import PostgresSchemas, pg_dsn, pg_schemas

__all__ = ["pair", "pg_dsn", "pg_schemas"]


@pytest.fixture
async def pair(pg_schemas: PostgresSchemas) -> AsyncIterator[tuple[Node, Node]]:
    a, b, _, _ = await open_pair(pg_schemas)
    yield a, b
    await a.close()
    await b.close()
