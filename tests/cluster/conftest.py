"""Fixtures for the cluster tests: several nodes (or server processes) on one PostgreSQL.

The PostgreSQL fixtures are the storage tests' (``tests/storage/conftest.py``): a
throwaway cluster for the session, a fresh schema per test, dropped at its end.
"""

from __future__ import annotations

from tests.storage.conftest import pg_dsn, pg_schemas

__all__ = ["pg_dsn", "pg_schemas"]
