"""Per-entity locks that exist only while they are used (see :meth:`Applier.staging`).

Invariants:

- An entity's lock exists while a holder or a waiter uses it; once the last of them
  leaves (released, failed or cancelled while waiting), its entry is gone. So the table
  holds only the entities being changed now. (Before, every entity ever changed kept its
  lock for the node's life: a server that touched 10 million entities held 10 million
  ``asyncio.Lock`` objects.)
- Waiters on one entity are served in arrival order (``asyncio.Lock``'s fairness).
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from mycelia.proto import EntityId

__all__ = ["EntityLocks"]


class _Entry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class EntityLocks:
    """The locks that serialise changes to each entity (see the module docstring)."""

    __slots__ = ("_locks",)

    def __init__(self) -> None:
        self._locks: dict[EntityId, _Entry] = {}

    async def acquire(self, entity_id: EntityId) -> None:
        """Wait for ``entity_id``'s lock and take it."""
        entry = self._locks.get(entity_id)
        if entry is None:
            entry = self._locks[entity_id] = _Entry()
        entry.users += 1
        try:
            await entry.lock.acquire()
        except BaseException:
            self._leave(entity_id, entry)
            raise

    def release(self, entity_id: EntityId) -> None:
        """Give back ``entity_id``'s lock (taken by :meth:`acquire`)."""
        entry = self._locks[entity_id]
        entry.lock.release()
        self._leave(entity_id, entry)

    def held(self, entity_id: EntityId) -> _Held:
        """``entity_id``'s lock as an async context manager."""
        return _Held(self, entity_id)

    def __len__(self) -> int:
        """Entities whose lock is held or waited for now."""
        return len(self._locks)

    def _leave(self, entity_id: EntityId, entry: _Entry) -> None:
        entry.users -= 1
        if not entry.users:
            del self._locks[entity_id]


class _Held:
    __slots__ = ("_entity_id", "_locks")

    def __init__(self, locks: EntityLocks, entity_id: EntityId) -> None:
        self._locks = locks
        self._entity_id = entity_id

    async def __aenter__(self) -> None:
        await self._locks.acquire(self._entity_id)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._locks.release(self._entity_id)
