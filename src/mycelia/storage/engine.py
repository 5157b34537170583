"""The storage-engine contract (ARCHITECTURE.md §6).

Every engine (memory, LMDB, PostgreSQL) satisfies :class:`StorageEngine` and passes the
same conformance suite (:mod:`mycelia.storage.testing`):

- events are added idempotently (re-adding reports "already had it") with their
  generation; read by id (with optional read-ahead) and by entity (parents first);
- states are read and written per entity; a missing one is ``None`` from ``get_state``;
- :meth:`StorageEngine.write` is **atomic**: events, states, meta and change-feed rows of
  one batch become durable together or not at all, and a batch's events are durable no
  later than the states that reference them;
- the change feed gives every written state a strictly increasing offset; ``read_since``
  never skips a committed batch;
- engines translate their backend's exceptions to :class:`~mycelia.errors.StorageError`
  subclasses, chained with ``from``.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

from mycelia.proto import AdmittedEvent, Clock, EntityId, EntityState
from mycelia.retrieval import EntityStore, StoredState

__all__ = ["FeedEntry", "StorageEngine"]


@dataclass(frozen=True, slots=True)
class FeedEntry:
    """One change-feed row: a state written at ``offset``."""

    offset: int
    entity_id: EntityId
    collection: str
    head: Clock


class StorageEngine(EntityStore, Protocol):
    """What a node needs from durable (or in-memory) storage."""

    async def events_of(self, entity_id: EntityId) -> list[AdmittedEvent]:
        """Every stored event of ``entity_id``, parents first (by generation, then id)."""
        ...

    async def get_states(self, ids: Collection[EntityId]) -> dict[EntityId, EntityState]:
        """The stored states among ``ids``."""
        ...

    async def scan(self, collection: str) -> list[StoredState]:
        """Every stored state of ``collection`` with its values (queries fall back to it)."""
        ...

    async def read_since(self, offset: int, *, limit: int = 1000) -> list[FeedEntry]:
        """Feed rows with offsets greater than ``offset``, ascending, at most ``limit``."""
        ...

    async def last_offset(self) -> int:
        """The largest offset written so far (0 before any write)."""
        ...

    async def get_meta(self, key: str) -> bytes | None:
        """A node-level record written through ``WriteBatch.meta``."""
        ...

    async def wait_for_feed(self, offset: int, *, timeout: float) -> bool:  # noqa: ASYNC109 - a bounded wait is the contract
        """Wait until the feed has a row beyond ``offset`` or ``timeout`` passes.

        Returns whether there is news. A hint only: callers re-read from their offset.
        """
        ...

    async def close(self) -> None:
        """Release the engine's resources; further use raises StorageError."""
        ...
