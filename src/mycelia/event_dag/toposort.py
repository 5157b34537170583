"""Deterministic topological order of an event batch (Kahn's algorithm, ties by id).

Wire order is never trusted (ARCHITECTURE.md §5): every multi-event input is sorted here
before it is applied. Duplicates collapse to one; only parents inside the batch order it
(parents outside are already known, or pending); ties are broken by ascending id, so the
output is a pure function of the *set* of events. A cycle cannot be built with content
hashes, but a batch that claims one is refused rather than looped on.
"""

from __future__ import annotations

from collections.abc import Iterable
from heapq import heapify, heappop, heappush
from typing import Protocol, TypeVar

from mycelia.errors import InvalidEvent
from mycelia.proto import Clock, EventId

__all__ = ["topological_sort"]


class _HasParents(Protocol):
    @property
    def id(self) -> EventId: ...
    @property
    def parent(self) -> Clock: ...


E = TypeVar("E", bound=_HasParents)


def topological_sort(events: Iterable[E]) -> list[E]:
    """``events`` parents first, ties by ascending id, duplicates collapsed.

    Raises:
        InvalidEvent: the batch's parent links form a cycle.
    """
    by_id: dict[EventId, E] = {}
    links: list[tuple[EventId, tuple[EventId, ...]]] = []
    for event in events:
        eid = event.id
        if eid not in by_id:
            by_id[eid] = event
            links.append((eid, event.parent.ids))  # a Clock: already de-duplicated
    ready, waiting, children = _in_batch_edges(links)
    heapify(ready)
    order: list[E] = []
    empty: list[EventId] = []
    while ready:
        eid = heappop(ready)
        order.append(by_id[eid])
        for child in children.get(eid, empty):
            left = waiting[child] - 1
            if left:
                waiting[child] = left
            else:
                del waiting[child]
                heappush(ready, child)
    if waiting:
        raise InvalidEvent(f"the batch's parent links form a cycle through {len(waiting)} events")
    return order


def _in_batch_edges(
    links: list[tuple[EventId, tuple[EventId, ...]]],
) -> tuple[list[EventId], dict[EventId, int], dict[EventId, list[EventId]]]:
    """Roots of the batch, in-batch parent counts, and children, from (id, parents) pairs."""
    present = {eid for eid, _ in links}
    waiting: dict[EventId, int] = {}
    children: dict[EventId, list[EventId]] = {}
    ready: list[EventId] = []
    for eid, parents in links:
        count = 0
        for parent in parents:
            if parent in present:
                count += 1
                if parent in children:
                    children[parent].append(eid)
                else:
                    children[parent] = [eid]
        if count:
            waiting[eid] = count
        else:
            ready.append(eid)
    return ready, waiting, children
