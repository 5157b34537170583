"""``mycelia.storage``: the storage-engine contract and its engines (ARCHITECTURE.md §6).

``MemoryStorage`` and ``LmdbStorage`` are always available; ``PostgresStorage`` needs the
``postgres`` extra (psycopg 3 and psycopg-pool) and is imported on first use, so a
missing driver costs nothing until then and then fails with a clear ImportError.
:mod:`mycelia.storage.testing` is the conformance suite; :mod:`mycelia.storage.dump` the
portable dump format; :mod:`mycelia.storage.plan` the index planner behind the LMDB and
PostgreSQL ``fetch`` pushdown.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mycelia.storage.engine import (
    DumpRecord,
    EntityRecord,
    FeedEntry,
    MetaRecord,
    StorageEngine,
)
from mycelia.storage.lmdb import LmdbStorage
from mycelia.storage.memory import MemoryStorage

if TYPE_CHECKING:
    from mycelia.storage.postgres import PostgresStorage

__all__ = [
    "DumpRecord",
    "EntityRecord",
    "FeedEntry",
    "LmdbStorage",
    "MemoryStorage",
    "MetaRecord",
    "PostgresStorage",
    "StorageEngine",
]


def __getattr__(name: str) -> Any:
    if name == "PostgresStorage":
        try:
            from mycelia.storage.postgres import PostgresStorage  # noqa: PLC0415
        except ImportError as exc:
            message = (
                "PostgresStorage needs psycopg 3 and psycopg-pool: pip install mycelia[postgres]"
            )
            raise ImportError(message) from exc
        return PostgresStorage
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
