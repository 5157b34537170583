"""What an applier must look up in storage before it admits events (ARCHITECTURE.md §5).

An event already stored is a no-op, and admission needs each parent's generation, so a
batch's ids and parents are looked up first, except where the entity's head here answers:

- **A parent on the head** (:func:`wanted`): admission takes its generation from the head,
  and a head event is the entity's own. A live edit pushed to a subscriber names the head
  it was made on; on an in-memory store, reading that parent decoded a stored event per
  edit (2,000 pushed edits: 3,746 → 1,999 decodes).
- **A remote commit made on the head** (:func:`on_head`), on a durable node whose every
  head tip is stored: an event that names only tips (or events of its own group) as
  parents and is none of them descends from the head, so it is stored only if the head
  has moved past it. Where the applier is the store's only writer the head is the stored
  one, so it is not. Where other processes write the store, the resident head may be
  behind and the event stored by one of them; the engine then joins the state the plan
  writes with the stored one (:mod:`mycelia.storage.join`, a state CRDT), which makes it
  the no-op it would have been. A genesis is always looked up: one for an existing entity
  is a duplicate.
- **A local commit made on the head** (:meth:`HeadLookups.surely_new`), on such a node,
  while the head is still the fork's: every stored event of the entity is the head or an
  ancestor of it (§4: admission keeps history closed, and every event stored here was
  placed on the head), and an event made on the head is a child of it, so none is stored.
  Where other processes write the store, one of them may have stored this very event only
  by making the same edit on the same head; the write is then the no-op the lookup would
  have made it, as for a remote commit. So a local commit there costs no round trip.

:class:`HeadLookups` applies these rules for an applier, to its resident entities.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

from mycelia.entity.entity import Entity
from mycelia.entity.placement import Placement
from mycelia.errors import MyceliaError
from mycelia.proto import EntityId, Event, EventId

__all__ = ["HeadLookups", "on_head", "wanted"]


def wanted(group: Sequence[Event], head: Mapping[EventId, int]) -> set[EventId]:
    """The ids to look up for one entity's ``group``: every event's own, and its parents
    that are not on ``head`` (the entity's head here)."""
    ids: set[EventId] = set()
    for event in group:
        ids.add(event.id)
        ids.update(p for p in event.parent if p not in head)
    return ids


def on_head(group: Sequence[Event], head: Mapping[EventId, int]) -> bool:
    """Whether a peer's ``group`` was made on ``head`` (each event names only tips of it or
    events of the group, and is none of them): on a durable node whose every tip is
    stored, it needs no lookup at all."""
    ids = {e.id for e in group}
    return all(
        e.parent and e.id not in head and all(p in head or p in ids for p in e.parent)
        for e in group
    )


class HeadLookups:
    """The rules above, for an applier: its resident entities (``load``) and whether their
    whole history is stored here (``placement``, on a ``durable`` node)."""

    def __init__(
        self,
        load: Callable[[EntityId], Awaitable[Entity | None]],
        placement: Placement,
        *,
        durable: bool,
    ) -> None:
        self._load = load
        self._placement = placement
        self._durable = durable

    async def ids(self, groups: Mapping[EntityId, list[Event]]) -> set[EventId]:
        """The ids to look up before admitting ``groups`` (:func:`wanted`, against each
        entity's head here)."""
        ids: set[EventId] = set()
        for entity_id, group in groups.items():
            try:
                entity = await self._load(entity_id)
            except MyceliaError:  # planning the group reports it
                entity = None
            ids |= wanted(group, entity.head_map if entity is not None else {})
        return ids

    async def needless(self, entity_id: EntityId, group: list[Event]) -> bool:
        """Whether a peer's events for one entity need no lookup at all: a remote commit
        made on the head this durable node holds (nearly all; :func:`on_head`)."""
        entity = await self._load(entity_id)
        return entity is not None and await self._closed(entity) and on_head(group, entity.head_map)

    async def surely_new(self, entity: Entity, fork_head: Mapping[EventId, int]) -> bool:
        """Whether an event made on ``fork_head`` needs no lookup before it is written: the
        head is still the fork's on a durable node (see the module docstring)."""
        return entity.head_map == fork_head and await self._closed(entity)

    async def _closed(self, entity: Entity) -> bool:
        """Whether this is a durable node holding ``entity`` with every tip of its head
        stored: where the no-lookup rules hold."""
        return self._durable and entity.exists and await self._placement.history_closed(entity)
