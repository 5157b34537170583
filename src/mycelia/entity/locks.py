"""Per-entity locks that exist only while they are used (see :meth:`Applier.staging`).

Invariants:

- An entity is in the table exactly while someone holds its lock; its waiters queue on
  it. The holder's release hands the lock straight to the oldest waiter still waiting
  (arrival order), or takes the entity out of the table when none is. So the table holds
  only the entities being changed now. (Before, every entity ever changed kept an
  ``asyncio.Lock`` for the node's life: a server that touched 10 million entities held 10
  million of them.)
- A waiter that is cancelled leaves nothing behind: if the lock was handed to it as it
  was cancelled, it hands the lock on; a release in the step it was cancelled passes it
  by (and drops it from the queue), and it still raises CancelledError.
- Taking a free lock does not suspend (:meth:`EntityLocks.try_acquire`): a one-entity
  commit pays a dictionary insert and delete for it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType

from mycelia.proto import EntityId

__all__ = ["EntityLocks"]


class EntityLocks:
    """The locks that serialise changes to each entity (see the module docstring)."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[EntityId, deque[asyncio.Future[None]] | None] = {}
        """Each entity whose lock is held → its waiters (``None``: none yet)."""

    def try_acquire(self, entity_id: EntityId) -> bool:
        """Take ``entity_id``'s lock if it is free now (never suspends)."""
        held = self._held
        if entity_id in held:
            return False
        held[entity_id] = None
        return True

    async def acquire(self, entity_id: EntityId) -> None:
        """Take ``entity_id``'s lock, waiting in turn while another holds it."""
        if self.try_acquire(entity_id):
            return
        waiters = self._held[entity_id]
        if waiters is None:
            waiters = self._held[entity_id] = deque()
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters.append(turn)
        try:
            await turn
        except BaseException:
            if turn.done() and not turn.cancelled():
                self.release(entity_id)  # handed to us just as we were cancelled: pass it on
            elif turn in waiters:  # (a release in the step we were cancelled dropped it)
                waiters.remove(turn)
            raise

    def release(self, entity_id: EntityId) -> None:
        """Give back ``entity_id``'s lock: to its oldest waiter, else to nobody."""
        waiters = self._held[entity_id]
        while waiters:
            turn = waiters.popleft()
            if not turn.done():
                turn.set_result(None)  # the lock is the waiter's now
                return
        del self._held[entity_id]

    def held(self, entity_id: EntityId) -> _Held:
        """``entity_id``'s lock as an async context manager."""
        return _Held(self, entity_id)

    def __len__(self) -> int:
        """Entities whose lock is held now."""
        return len(self._held)

    def __contains__(self, entity_id: object) -> bool:
        """Whether ``entity_id``'s lock is held now (a run is changing the entity)."""
        return entity_id in self._held


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
