"""The PostgreSQL engine's connections: how each pooled connection is set up, and how
psycopg's errors become the engine's (ARCHITECTURE.md §6, §10).

Invariants:

- Every connection the pool hands out has been through :func:`configure` first: the
  engine's array dumpers registered (:mod:`mycelia.storage.postgres_arrays`) and JIT off.
- No psycopg exception leaves the engine: each is translated at the edge by
  :func:`translate` and chained with ``from`` — a read-only transaction or a missing
  privilege is StorageReadOnly, corrupt data or a corrupt index StorageCorrupt, anything
  else StorageError.
"""

from __future__ import annotations

from typing import Any

import psycopg

from mycelia.errors import StorageCorrupt, StorageError, StorageReadOnly
from mycelia.storage.postgres_arrays import register

__all__ = ["configure", "translate"]


def translate(exc: Exception, what: str) -> StorageError:
    """The engine's error for psycopg's ``exc``, ``what`` saying what failed (see above)."""
    if isinstance(
        exc, (psycopg.errors.ReadOnlySqlTransaction, psycopg.errors.InsufficientPrivilege)
    ):
        return StorageReadOnly(f"{what}: {exc}")
    if isinstance(exc, (psycopg.errors.DataCorrupted, psycopg.errors.IndexCorrupted)):
        return StorageCorrupt(f"{what}: {exc}")
    return StorageError(f"{what}: {exc}")


async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
    """Each pooled connection sends the engine's array columns in one pass
    (:mod:`mycelia.storage.postgres_arrays`), and runs its statements without JIT: the
    planner's cost of the feed's read (a lateral join per row) is past ``jit_above_cost``,
    and compiling it took 13-200 ms a run, for a query that takes a fraction of one."""
    register(conn)
    await conn.execute("SET jit = off")
