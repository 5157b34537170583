"""Read-ahead for sources that can read events cheaply one by one (memory, LMDB).

See :mod:`mycelia.retrieval.protocols`: an answer may carry up to ``ahead`` ancestors of
the asked ids, nearest first, so a comparison walking a long chain needs few calls.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection

from mycelia.proto import AdmittedEvent, EventId

__all__ = ["events_with_ancestors"]


def events_with_ancestors(
    read: Callable[[EventId], AdmittedEvent | None],
    ids: Collection[EventId],
    ahead: int,
) -> dict[EventId, AdmittedEvent]:
    """The events among ``ids`` that ``read`` finds, plus up to ``ahead`` of their ancestors."""
    found: dict[EventId, AdmittedEvent] = {}
    for eid in ids:
        event = read(eid)
        if event is not None:
            found[eid] = event
    if ahead <= 0:
        return found
    queue = deque(p for e in list(found.values()) for p in e.event.parent)
    budget = ahead
    while queue and budget:
        eid = queue.popleft()
        if eid in found:
            continue
        event = read(eid)
        if event is None:
            continue
        found[eid] = event
        budget -= 1
        queue.extend(event.event.parent)
    return found
