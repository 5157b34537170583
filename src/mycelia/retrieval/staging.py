"""The staging map: events made visible to comparison before they are durable.

Invariants (ARCHITECTURE.md §5): staging is memory only; a staged event is found by
``get_events`` and never by ``event_stored``; the applier commits staged events to
storage in the same write as the state that references them, then discards the map.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

from mycelia.proto import AdmittedEvent, EventId

__all__ = ["StagingMap"]


class StagingMap:
    """Events staged by one applier run, in staging order."""

    __slots__ = ("_events",)

    def __init__(self) -> None:
        self._events: dict[EventId, AdmittedEvent] = {}

    def stage(self, event: AdmittedEvent) -> None:
        """Stage ``event`` (staging the same id twice keeps the first)."""
        self._events.setdefault(event.id, event)

    def get(self, event_id: EventId) -> AdmittedEvent | None:
        """The staged event with ``event_id``, if any."""
        return self._events.get(event_id)

    def lookup(self, ids: Collection[EventId]) -> dict[EventId, AdmittedEvent]:
        """The staged events among ``ids``."""
        events = self._events
        return {i: events[i] for i in ids if i in events}

    def staged(self) -> list[AdmittedEvent]:
        """Every staged event, in staging order."""
        return list(self._events.values())

    def discard(self) -> None:
        """Forget everything staged."""
        self._events.clear()

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._events

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterator[EventId]:
        return iter(self._events)
