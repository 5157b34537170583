"""The queues between a node's commits and the subscriptions it serves one peer
(:mod:`mycelia.node.serving`), both bounded in bytes so a peer that falls behind is cut
off (it reconnects and catches up) instead of holding memory:

- :class:`SubscriberFeed` holds the committed changes a peer's subscriptions have not
  been pushed yet;
- :class:`Missed` holds the changes committed while one subscription is being answered
  (the query stands only once its answer is built), fed to the peer's feed then.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from typing import Final

from mycelia.entity import EntityChange
from mycelia.proto import AdmittedEvent

__all__ = ["FEED_BYTES", "TAKE_BYTES", "Missed", "SubscriberFeed", "changes_size", "events_size"]

FEED_BYTES: Final = 8 * 1024 * 1024
"""Bytes of committed changes a subscriber may fall behind by before it is cut off."""
TAKE_BYTES: Final = 1024 * 1024
"""Most bytes of queued changes one push to a subscriber takes (:meth:`SubscriberFeed.get`)."""


def events_size(events: Iterable[AdmittedEvent]) -> int:
    """The bytes of ``events`` as a frame holds them."""
    return sum(len(e.event.to_bytes()) + 5 for e in events)


def changes_size(changes: list[EntityChange]) -> int:
    """About what a batch of changes holds in memory (its events' bytes)."""
    return sum(256 + events_size(c.events) for c in changes)


class Missed:
    """The changes committed while a subscription was being answered, bounded in bytes
    as a subscriber's feed is (past that the peer is cut off: it reconnects)."""

    __slots__ = ("changes", "collection", "overflowed", "size")

    def __init__(self, collection: str) -> None:
        self.collection = collection
        """The collection the subscription reads."""
        self.changes: list[tuple[list[EntityChange], int]] = []
        self.size = 0
        self.overflowed = False

    def add(self, changes: list[EntityChange], size: int) -> None:
        if self.overflowed or self.size + size > FEED_BYTES:
            self.overflowed = True
            self.changes.clear()
            return
        self.changes.append((changes, size))
        self.size += size


class SubscriberFeed:
    """One subscriber's queue of committed changes, bounded in bytes."""

    def __init__(self, budget: int) -> None:
        self._budget = budget
        self._items: deque[tuple[list[EntityChange], int]] = deque()
        self._size = 0
        self._arrived = asyncio.Event()
        self._closed = False

    def offer(self, changes: list[EntityChange], size: int) -> bool:
        """Queue ``changes`` (about ``size`` bytes); False if that is over the budget."""
        if self._closed:
            return True
        if self._items and self._size + size > self._budget:
            return False
        self._items.append((changes, size))
        self._size += size
        self._arrived.set()
        return True

    async def get(self) -> list[EntityChange] | None:
        """The oldest changes, joined in commit order with those queued after them (up to
        :data:`TAKE_BYTES` in all): a peer that fell behind gets them in one push, not one
        push per commit. None once closed."""
        while not self._items:
            if self._closed:
                return None
            self._arrived.clear()
            await self._arrived.wait()
        items = self._items
        changes, taken = items.popleft()
        if items and taken + items[0][1] <= TAKE_BYTES:
            changes = list(changes)
            while items and taken + items[0][1] <= TAKE_BYTES:
                more, size = items.popleft()
                changes += more
                taken += size
        self._size -= taken
        return changes

    def close(self) -> None:
        """Drop what is queued; :meth:`get` returns None."""
        self._closed = True
        self._items.clear()
        self._size = 0
        self._arrived.set()
