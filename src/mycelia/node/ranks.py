"""A LIMIT query's result in rank order, so that most changes are placed without storage
(ARCHITECTURE.md §8).

A row's rank is its ORDER BY key, then its entity id's bytes (the order every engine's
pushdown and the reference executor give). :class:`Ranks` holds the ranks of a LIMIT
result read from storage and keeps one invariant: **every row that matches and is not a
member ranks after the last member, or there is none** (the result is short of the
LIMIT). A change is placed from the ranks alone when that invariant says where it goes:

- a member that still matches stays, if the result is short or it ranks before the old
  last member; else storage ranks it (a row that is no member may now rank before it);
- a member that no longer matches leaves a short result; from a full one storage ranks
  the refill;
- a match that is no member comes in if the result is short, or if it ranks before the
  last member (which then leaves); else nothing changes;
- a row that neither matches nor is a member changes nothing.

Used by live queries (:mod:`mycelia.node.live`) and by the subscriptions a node serves
(:mod:`mycelia.node.serving`); both re-run the query when :meth:`Ranks.place` says
storage must rank a change, and start again from that result.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, KeysView

from mycelia.proto import EntityId

__all__ = ["Ranks"]

Rank = tuple[bytes, bytes, EntityId]
"""(ORDER BY key, entity id bytes, entity id): two rows never share the first two."""


class Ranks:
    """The ranks of a LIMIT query's members, sorted (see the module docstring)."""

    __slots__ = ("_limit", "_of", "_sorted")

    def __init__(self, limit: int, members: Iterable[tuple[EntityId, bytes]]) -> None:
        """``members``: the result storage gave, each with its ORDER BY key."""
        self._limit = limit
        self._of: dict[EntityId, Rank] = {e: (key, bytes(e), e) for e, key in members}
        self._sorted = sorted(self._of.values())

    def members(self) -> KeysView[EntityId]:
        """The members now."""
        return self._of.keys()

    def place(self, entity_id: EntityId, key: bytes | None) -> tuple[bool, EntityId | None] | None:
        """Place a changed row that now has the ORDER BY ``key`` (``None``: it no longer
        matches). Returns whether it is a member now and the member it pushed out, if
        any; ``None``, changing nothing, when only storage can rank it."""
        old = self._of.get(entity_id)
        new = None if key is None else (key, bytes(entity_id), entity_id)
        full = len(self._sorted) >= self._limit
        if old is not None:
            if full and (new is None or new > self._sorted[-1]):
                return None  # it makes room, or a row that is no member may rank before it
            self._drop(entity_id, old)
            if new is not None:
                self._add(entity_id, new)
            return new is not None, None
        if new is None or (full and new > self._sorted[-1]):
            return False, None  # no match, or it ranks past the LIMIT
        pushed = None
        if full:
            last = self._sorted[-1]
            pushed = last[2]
            self._drop(pushed, last)
        self._add(entity_id, new)
        return True, pushed

    def _add(self, entity_id: EntityId, rank: Rank) -> None:
        self._of[entity_id] = rank
        bisect.insort(self._sorted, rank)

    def _drop(self, entity_id: EntityId, rank: Rank) -> None:
        del self._of[entity_id]
        del self._sorted[bisect.bisect_left(self._sorted, rank)]
