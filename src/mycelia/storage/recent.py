"""Recent events kept decoded by a durable engine, so most event reads cost no I/O.

A commit reads its parents, which are usually the events of the commit before; a walk
reads the entity's last few events; a server answers its clients' requests for them. An
event never changes once stored, so a copy of it is never stale. :class:`RecentEvents`
is the engines' bounded map of the events they wrote or read lately:

- at most :data:`RECENT_EVENTS` events and :data:`RECENT_BYTES` of their canonical bytes
  (a few large events push out many small ones), least recently remembered first out;
- an engine lets go of an entity's events **before** a write that forgets the entity
  commits (:meth:`RecentEvents.forget_entities`), so no read after it finds them here;
- :meth:`RecentEvents.read` answers what it holds, with the read-ahead the engine's own
  query would give, and names the ids the engine must still read.

Only this process's forgets are seen. A store several processes write (PostgreSQL) may
forget an entity through another process, which this cache would not learn; forgetting
is how an ephemeral node's cache drops the local commits its durable peer refused
(ARCHITECTURE.md §6), and such a cache does not share its store.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable
from typing import Final

from mycelia.proto import AdmittedEvent, EntityId, EventId
from mycelia.retrieval.readahead import events_with_ancestors

__all__ = ["RECENT_BYTES", "RECENT_EVENTS", "RecentEvents"]

RECENT_EVENTS: Final = 4096
"""How many recent events are kept decoded (at most)."""
RECENT_BYTES: Final = 16 * 1024 * 1024
"""How many bytes of recent events are kept decoded (at most): a commit of large events
keeps few of them."""


class RecentEvents:
    """A bounded map of recently written or read events (see the module docstring)."""

    __slots__ = ("_bytes", "_events", "_max_bytes", "_max_events")

    def __init__(self, *, events: int = RECENT_EVENTS, max_bytes: int = RECENT_BYTES) -> None:
        self._events: OrderedDict[EventId, AdmittedEvent] = OrderedDict()
        self._bytes = 0
        self._max_events = events
        self._max_bytes = max_bytes

    @property
    def bytes(self) -> int:
        """The canonical bytes of the events held now."""
        return self._bytes

    def get(self, event_id: EventId) -> AdmittedEvent | None:
        """The event, if it is held."""
        return self._events.get(event_id)

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._events

    def read(
        self, ids: Collection[EventId], ahead: int
    ) -> tuple[dict[EventId, AdmittedEvent], list[EventId]]:
        """The held events among ``ids`` (plus up to ``ahead`` held ancestors of them), and
        the ids not held, which the engine reads itself. With ids still to read, no
        read-ahead is taken here: the engine's query reads ahead from all of them."""
        held = self._events
        rest = [i for i in ids if i not in held]
        if rest:
            return {i: held[i] for i in ids if i in held}, rest
        return events_with_ancestors(held.get, ids, ahead), []

    def remember(self, events: Iterable[AdmittedEvent]) -> None:
        """Hold ``events`` (stored ones only: what was written or read back)."""
        held = self._events
        added = 0
        for event in events:  # (every write of every engine comes here)
            event_id = event.id
            if event_id not in held:
                held[event_id] = event
                added += len(event.event.canonical)
        self._bytes += added
        if len(held) > self._max_events or self._bytes > self._max_bytes:
            while held and (len(held) > self._max_events or self._bytes > self._max_bytes):
                _, dropped = held.popitem(last=False)
                self._bytes -= len(dropped.event.canonical)

    def forget_entities(self, entities: Collection[EntityId]) -> None:
        """Let go of the events of ``entities`` (a write is about to forget them)."""
        held = self._events
        for event_id in [i for i, e in held.items() if e.entity_id in entities]:
            self._bytes -= len(held.pop(event_id).event.to_bytes())
