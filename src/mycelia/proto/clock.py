"""The :class:`Clock`: an immutable, sorted, de-duplicated set of event ids (ARCHITECTURE.md §3).

Invariants:

- Every way to make a clock normalises (sort by bytes, drop duplicates), the decoder
  included, so nothing downstream ever sees an unsorted or duplicated clock and two clocks
  are equal exactly when they hold the same ids.
- Membership is a binary search over the sorted tuple.
- An entity's head is a clock that should be an antichain; the type does not enforce that
  (it cannot without the DAG), the applier does.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator
from typing import Final

from mycelia.proto.ids import EventId

__all__ = ["EMPTY_CLOCK", "SINGLES_CAP", "Clock"]


class Clock:
    """An immutable, sorted, de-duplicated set of :class:`EventId`."""

    __slots__ = ("_hash", "_ids")

    _ids: tuple[EventId, ...]
    _hash: int | None

    def __init__(self, ids: Iterable[EventId] = ()) -> None:
        self._ids = tuple(sorted(set(ids)))
        self._hash = None

    @classmethod
    def _of_sorted(cls, ids: tuple[EventId, ...]) -> Clock:
        # Private fast path for callers that have just checked (or built) a strictly
        # increasing tuple; there is deliberately no public non-normalising constructor.
        clock = cls.__new__(cls)
        clock._ids = ids
        clock._hash = None
        return clock

    @classmethod
    def single(cls, event_id: EventId) -> Clock:
        """The clock holding one id: the one shared clock of that id while a bounded table
        remembers it (see :data:`SINGLES_CAP`)."""
        clock = _SINGLES.get(event_id)
        if clock is None:
            if len(_SINGLES) >= SINGLES_CAP:
                _SINGLES.clear()
            clock = _SINGLES[event_id] = cls._of_sorted((event_id,))
        return clock

    @property
    def ids(self) -> tuple[EventId, ...]:
        """The ids, ascending."""
        return self._ids

    def __contains__(self, event_id: object) -> bool:
        ids = self._ids
        i = bisect_left(ids, event_id)  # type: ignore[call-overload]
        return i < len(ids) and bool(ids[i] == event_id)

    def __iter__(self) -> Iterator[EventId]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def __bool__(self) -> bool:
        return bool(self._ids)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Clock):
            return self._ids == other._ids
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(self._ids)
        return self._hash

    def __repr__(self) -> str:
        inner = ", ".join(i.to_base64()[:8] for i in self._ids)
        return f"Clock([{inner}])"

    def with_event(self, event_id: EventId) -> Clock:
        """This clock plus ``event_id``."""
        ids = self._ids
        i = bisect_left(ids, event_id)
        if i < len(ids) and ids[i] == event_id:
            return self
        return Clock._of_sorted((*ids[:i], event_id, *ids[i:]))

    def without(self, event_id: EventId) -> Clock:
        """This clock minus ``event_id`` (absent ids are a no-op)."""
        ids = self._ids
        i = bisect_left(ids, event_id)
        if i < len(ids) and ids[i] == event_id:
            return Clock._of_sorted((*ids[:i], *ids[i + 1 :]))
        return self

    def union(self, other: Iterable[EventId]) -> Clock:
        """Every id in either."""
        return Clock((*self._ids, *other))

    def difference(self, other: Iterable[EventId]) -> Clock:
        """The ids of this clock that are not in ``other``."""
        drop = set(other)
        return Clock._of_sorted(tuple(i for i in self._ids if i not in drop))

    def intersection(self, other: Iterable[EventId]) -> Clock:
        """The ids in both."""
        keep = set(other)
        return Clock._of_sorted(tuple(i for i in self._ids if i in keep))

    def issubset(self, other: Clock) -> bool:
        """Whether every id of this clock is in ``other``."""
        return all(i in other for i in self._ids)


EMPTY_CLOCK: Final = Clock()

SINGLES_CAP: Final = 8192
"""How many one-id clocks :meth:`Clock.single` shares (the table is cleared when full). A
linear history's head is one id, and so is each of its events' parents: every client of
a process that follows an entity made its own clock (and tuple) of each new head, twice,
and kept them, so each change left four more objects for full collections to walk at
each client (W3's 100 clients a process). They are the same clocks at every client: one
of each is shared. Engines decode on worker threads too: a race only costs a copy."""
_SINGLES: dict[EventId, Clock] = {}
