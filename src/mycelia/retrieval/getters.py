"""Getters: staging first, then storage, then (on ephemeral nodes) a remote peer.

:class:`LocalGetter` is what a durable node compares with: staging, then its storage,
which is definitive. :class:`CachedGetter` adds a remote source for ids neither has; what
it fetches is verified (the event must hash to the id asked for and belong to the entity
being compared) and remembered so the next comparison does not ask again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence

from mycelia.proto import AdmittedEvent, EntityId, EventId
from mycelia.retrieval.protocols import EventSource
from mycelia.retrieval.staging import StagingMap

__all__ = ["CachedGetter", "LocalGetter", "RemoteEvents"]

RemoteEvents = Callable[[Sequence[EventId]], Awaitable[Sequence[AdmittedEvent]]]
"""Asks a durable peer for events by id (the node layer supplies it)."""


class LocalGetter:
    """Staging, then storage."""

    __slots__ = ("_definitive", "_staging", "_storage")

    def __init__(self, staging: StagingMap, storage: EventSource, *, definitive: bool) -> None:
        self._staging = staging
        self._storage = storage
        self._definitive = definitive

    async def get_events(
        self, ids: Collection[EventId], *, ahead: int = 0
    ) -> Mapping[EventId, AdmittedEvent]:
        """Staged events first; the rest from storage (which may read ahead)."""
        found = self._staging.lookup(ids)
        if len(found) < len(ids) or ahead:
            rest = [i for i in ids if i not in found]
            more = await self._storage.get_events(rest, ahead=ahead)
            for eid, event in more.items():
                found.setdefault(eid, event)
        return found

    async def event_stored(self, event_id: EventId) -> bool:
        """Whether storage (not staging) holds ``event_id``."""
        return event_id in await self._storage.get_events((event_id,))

    def storage_is_definitive(self) -> bool:
        """True on durable nodes."""
        return self._definitive

    def stage(self, event: AdmittedEvent) -> None:
        """Stage ``event`` for this applier run."""
        self._staging.stage(event)

    def staged(self) -> list[AdmittedEvent]:
        """The staged events, in staging order."""
        return self._staging.staged()


class CachedGetter(LocalGetter):
    """Staging, storage, then a remote peer; remote answers are verified and remembered."""

    __slots__ = ("_entity", "_fetched", "_remote")

    def __init__(
        self,
        staging: StagingMap,
        storage: EventSource,
        remote: RemoteEvents,
        *,
        entity_id: EntityId,
    ) -> None:
        super().__init__(staging, storage, definitive=False)
        self._remote = remote
        self._entity = entity_id
        self._fetched: dict[EventId, AdmittedEvent] = {}

    async def get_events(
        self, ids: Collection[EventId], *, ahead: int = 0
    ) -> Mapping[EventId, AdmittedEvent]:
        """Local first; ids still missing are asked of the remote peer in one request."""
        found = dict(await super().get_events(ids, ahead=ahead))
        missing = [i for i in ids if i not in found]
        if missing:
            found.update({i: self._fetched[i] for i in missing if i in self._fetched})
            ask = [i for i in missing if i not in found]
            if ask:
                wanted = set(ask)
                for event in await self._remote(ask):
                    # Only what was asked for, for this entity: a peer cannot inject events.
                    if event.id in wanted and event.entity_id == self._entity:
                        self._fetched[event.id] = event
                        found[event.id] = event
        return found

    def fetched(self) -> list[AdmittedEvent]:
        """Events fetched from the remote during this run (to be stored with the result)."""
        return list(self._fetched.values())
