"""``mycelia.storage``: the storage-engine contract and its engines.

``MemoryStorage`` is always available; ``LmdbStorage`` and ``PostgresStorage`` are the
durable engines (PostgreSQL needs the ``postgres`` extra).
"""

from mycelia.storage.engine import FeedEntry, StorageEngine
from mycelia.storage.memory import MemoryStorage

__all__ = ["FeedEntry", "MemoryStorage", "StorageEngine"]
