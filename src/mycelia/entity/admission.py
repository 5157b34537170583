"""Admission: which events of a batch may be staged, and with which generation (§4).

History stays closed: an event is admitted only once every parent is known for the same
entity — staged earlier in the batch (which is sorted parents first), stored, or named in
the head of a snapshot this node holds or, on a cache, merged (``Entity.boundary``: whose
generations the snapshot carries; a cache that took a snapshot never stores the events
below it, and the others' concurrent edits name its tips long after its head moved on). A parent
from another entity is refused; an event whose parents are unknown is returned as *held*
with the ids it misses (the applier keeps it pending and reports them). A genesis must
bind this node's system root (the root genesis binds none). The generation of an admitted
event is computed here, from its parents, never taken from the sender.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from mycelia.entity.entity import Entity
from mycelia.errors import EventNotFound, ForeignSystem, InvalidEvent, SystemNotReady
from mycelia.event_dag import topological_sort
from mycelia.proto import SYSTEM_COLLECTION, AdmittedEvent, EntityId, Event, EventId
from mycelia.retrieval import StagingMap

__all__ = ["Admission", "admit", "admit_fresh", "by_entity", "check_genesis"]


@dataclass(slots=True)
class Admission:
    """The outcome of admitting one entity's events."""

    staging: StagingMap = field(default_factory=StagingMap)
    held: list[tuple[Event, list[EventId]]] = field(default_factory=list)
    """Events whose parents are unknown, with the ids they miss."""


def admit(
    entity: Entity,
    group: list[Event],
    known: Mapping[EventId, AdmittedEvent],
    *,
    root: EntityId | None,
    atomic: bool,
) -> Admission:
    """Stage the new events of ``group`` whose parents are known; hold the others.

    ``known`` are stored events (the batch's ids and parents, looked up once). Raises
    InvalidEvent (collection, foreign parent), ForeignSystem / SystemNotReady (genesis),
    and, when ``atomic``, EventNotFound instead of holding anything.
    """
    outcome = Admission()
    staging, head, boundary = outcome.staging, entity.head_map, entity.boundary
    for event in group if len(group) == 1 else topological_sort(group):
        if event.id in known or event.id in staging:
            continue  # already here: a no-op
        if event.collection != entity.collection:
            raise InvalidEvent(
                f"event {event.id} names collection {event.collection!r}, but entity "
                f"{entity.entity_id} lives in {entity.collection!r}"
            )
        if event.is_genesis:
            check_genesis(event, root)
            staging.stage(AdmittedEvent(event, 1))
            continue
        generations, missing = _parent_generations(event, staging, known, head, boundary)
        if missing and (event.id in head or event.id in boundary):
            continue  # a snapshot's head event, its history still unknown: a no-op
        if missing:
            if atomic:
                raise EventNotFound(
                    f"event {event.id} has parents this node does not know: "
                    + ", ".join(map(str, missing)),
                    event_id=missing[0],
                )
            outcome.held.append((event, missing))
            continue
        # (A snapshot's head event whose parents are known now is staged too: it is
        # already applied, but storing it lets the snapshot's history be filled in.)
        staging.stage(AdmittedEvent(event, 1 + max(generations)))
    return outcome


def by_entity(events: Iterable[Event]) -> dict[EntityId, list[Event]]:
    """``events`` grouped by the entity each changes, in the order given (what admission
    takes: one entity's events at a time)."""
    groups: dict[EntityId, list[Event]] = {}
    for event in events:
        groups.setdefault(event.entity_id, []).append(event)
    return groups


def admit_fresh(
    entity: Entity,
    group: list[Event],
    known: Mapping[EventId, AdmittedEvent],
    *,
    parents: Mapping[EventId, int],
    root: EntityId | None,
) -> list[AdmittedEvent]:
    """Admit a local transaction's events for one entity, parents first.

    They are fresh (made here on a fork, see the applier), so each parent is staged
    earlier in the group or a tip of the fork's head, whose generation ``parents`` gives
    (also when the head here has moved on since the fork). An event already stored is a
    no-op. Raises InvalidEvent (collection), ForeignSystem / SystemNotReady (genesis) and
    EventNotFound for a parent the fork did not hold (a bug in the caller).
    """
    staged: dict[EventId, AdmittedEvent] = {}
    for event in group if len(group) == 1 else topological_sort(group):
        if event.id in known:
            continue  # the very same event (same parents, same edits) is here already
        if event.collection != entity.collection:
            raise InvalidEvent(
                f"event {event.id} names collection {event.collection!r}, but entity "
                f"{entity.entity_id} lives in {entity.collection!r}"
            )
        if event.is_genesis:
            check_genesis(event, root)
            staged[event.id] = AdmittedEvent(event, 1)
            continue
        generations = []
        for parent in event.parent:
            found = staged.get(parent)
            generation = found.generation if found is not None else parents.get(parent)
            if generation is None:
                raise EventNotFound(
                    f"local event {event.id} names parent {parent}, which its fork did not hold",
                    event_id=parent,
                )
            generations.append(generation)
        staged[event.id] = AdmittedEvent(event, 1 + max(generations))
    return list(staged.values())


def _parent_generations(
    event: Event,
    staging: StagingMap,
    known: Mapping[EventId, AdmittedEvent],
    head: Mapping[EventId, int],
    boundary: Mapping[EventId, int],
) -> tuple[list[int], list[EventId]]:
    """The known parents' generations and the unknown parents' ids."""
    generations, missing = [], []
    for parent in event.parent:
        found = staging.get(parent) or known.get(parent)
        if found is not None:
            if found.entity_id != event.entity_id:
                raise InvalidEvent(f"event {event.id} names parent {parent} of another entity")
            generations.append(found.generation)
        elif parent in head:
            generations.append(head[parent])
        elif parent in boundary:
            generations.append(boundary[parent])
        else:
            missing.append(parent)
    return generations, missing


def check_genesis(event: Event, root: EntityId | None) -> None:
    """Refuse a genesis that does not bind this node's system ``root``."""
    if event.system is None:
        if event.collection != SYSTEM_COLLECTION:
            raise InvalidEvent(f"genesis {event.id} binds no system but is not a root")
        if root is not None and root != event.entity_id:
            raise ForeignSystem(f"root {event.entity_id} is not this node's system {root}")
        return
    if root is None:
        raise SystemNotReady("this node has no system root: create_system() or join_system()")
    if event.system != root:
        raise ForeignSystem(
            f"entity {event.entity_id} was created in system {event.system}, not {root}"
        )
