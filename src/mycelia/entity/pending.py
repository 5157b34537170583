"""Events held until their parents arrive (ARCHITECTURE.md §4, decision 4).

An event whose parents are not known yet is never dropped: it waits here, bounded, keyed
by the ids it misses; the node asks peers for those ids, and when they are admitted the
waiting events are released and ingested again. When the pool is full the oldest events
are shed (and logged): a peer can always re-send them, and memory stays bounded.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable
from typing import Final

from mycelia.proto import Event, EventId

__all__ = ["DEFAULT_PENDING", "PendingPool"]

DEFAULT_PENDING: Final = 10_000
"""Most events held at once."""

log = logging.getLogger(__name__)


class PendingPool:
    """Events waiting for missing parents, oldest first."""

    __slots__ = ("_by_missing", "_capacity", "_events", "shed")

    def __init__(self, *, capacity: int = DEFAULT_PENDING) -> None:
        self._events: OrderedDict[EventId, tuple[Event, frozenset[EventId]]] = OrderedDict()
        self._by_missing: dict[EventId, set[EventId]] = {}
        self._capacity = capacity
        self.shed = 0
        """Events dropped because the pool was full (they must be re-sent)."""

    def hold(self, event: Event, missing: Iterable[EventId]) -> None:
        """Keep ``event`` until every id in ``missing`` has been admitted."""
        if event.id in self._events:
            return
        waiting = frozenset(missing)
        self._events[event.id] = (event, waiting)
        for eid in waiting:
            self._by_missing.setdefault(eid, set()).add(event.id)
        while len(self._events) > self._capacity:
            oldest, (_, its_missing) = self._events.popitem(last=False)
            self._unlink(oldest, its_missing)
            self.shed += 1
            log.warning("pending pool full: shed event %s (a peer must re-send it)", oldest)

    def release(self, admitted: Iterable[EventId]) -> list[Event]:
        """Events that were waiting on any of ``admitted`` (to be ingested again)."""
        out: dict[EventId, Event] = {}
        for eid in admitted:
            for waiter in self._by_missing.pop(eid, ()):
                entry = self._events.pop(waiter, None)
                if entry is not None:
                    self._unlink(waiter, entry[1])
                    out[waiter] = entry[0]
        return list(out.values())

    def missing(self) -> set[EventId]:
        """Every id some held event is waiting for."""
        return set(self._by_missing)

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._events

    def __len__(self) -> int:
        return len(self._events)

    def _unlink(self, event_id: EventId, missing: frozenset[EventId]) -> None:
        for eid in missing:
            waiters = self._by_missing.get(eid)
            if waiters is not None:
                waiters.discard(event_id)
                if not waiters:
                    del self._by_missing[eid]
