"""The retrieval capabilities (ARCHITECTURE.md §4, STYLE.md §3).

What the comparison needs from a getter: for each id it asks about, the event **and its
generation** (an :class:`~mycelia.proto.AdmittedEvent`), in batches — one call per frontier
step, so a remote getter costs one round trip per step. Ids the getter does not know are
simply absent from the answer; the comparison decides what absence means.

Read-ahead: a long walk passes ``ahead > 0``, inviting the getter to add up to that many
*ancestors* of the asked ids to its answer (nearest first). A getter is free to ignore it;
one that honours it turns a walk down a long chain from one call per event into a few
calls in all, which matters most for a remote getter (one round trip each).

Generations are computed by the receiver on admission (1 + the largest parent generation)
and stored with the event; they are never taken from the wire.

Three capabilities, each what one consumer needs and no more: :class:`EventSource` (the
comparison reads through it), :class:`GetState` (entity states), and :class:`EntityStore`
(the applier: both reads plus one atomic write). Staging is not a capability: the applier
stages into a :class:`~mycelia.retrieval.StagingMap` it owns, and a getter reads it first.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from mycelia.proto import AdmittedEvent, Clock, EntityId, EntityState, EventId

__all__ = [
    "EntityStore",
    "EventSource",
    "GetState",
    "StoredState",
    "WriteBatch",
    "WriteResult",
]


class EventSource(Protocol):
    """Where admitted events are read from (a storage engine satisfies it)."""

    async def get_events(
        self, ids: Collection[EventId], *, ahead: int = 0
    ) -> Mapping[EventId, AdmittedEvent]:
        """The events among ``ids`` that are known (unknown ids are absent), plus up to
        ``ahead`` of their ancestors if the source can read ahead cheaply."""
        ...


class GetState(Protocol):
    """Read access to entity states."""

    async def get_state(self, entity_id: EntityId) -> EntityState | None:
        """The stored state of ``entity_id``, or ``None`` if there is none."""
        ...


@dataclass(frozen=True, slots=True)
class StoredState:
    """An entity state as storage keeps it: the snapshot plus its queryable field values."""

    state: EntityState
    values: Mapping[str, object] = field(default_factory=dict)
    """Field name → value (LWW values and text content), for query pushdown."""


@dataclass(frozen=True, slots=True)
class WriteBatch:
    """Everything one commit makes durable, written atomically (ARCHITECTURE.md §5, §6).

    Forgotten entities first, then events, then the states that reference them: an engine
    must make all of it durable, or none of it. Each state also appends one change-feed row.
    """

    events: tuple[AdmittedEvent, ...] = ()
    states: tuple[StoredState, ...] = ()
    meta: tuple[tuple[str, bytes | None], ...] = ()
    """Small node-level records (system root, node key, outbox); ``None`` deletes."""
    forget: tuple[EntityId, ...] = ()
    """Entities to drop whole (every event, the state, its index rows) *before* the rest of
    the batch is written: how an ephemeral node's cache lets go of an entity whose local
    commits its durable peer refused (ARCHITECTURE.md §7). Forgetting writes no feed row;
    a state written for the same entity in the same batch writes one as usual."""
    bases: Mapping[EntityId, Clock] = field(default_factory=dict)
    """Per written state's entity, the stored head its state was made on (what the writer
    read or last wrote; empty for an entity it found none of): the state descends from it.
    An engine that other processes write may take a stored head still equal to it as proof
    that no join is needed (:mod:`mycelia.storage.postgres_write`); any other engine
    ignores it. An entity missing here proves nothing."""


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What a write did: which events were new, and the change-feed offsets it took."""

    new_events: frozenset[EventId]
    offsets: tuple[int, ...]
    """One strictly increasing offset per state written, in batch order."""


class EntityStore(EventSource, GetState, Protocol):
    """What the applier needs from storage: read events and states, write atomically."""

    async def get_states(self, ids: Collection[EntityId]) -> dict[EntityId, EntityState]:
        """The stored states among ``ids`` (one read for many: a fresh client adopts a
        thousand snapshots at once)."""
        ...

    async def write(self, batch: WriteBatch) -> WriteResult:
        """Make ``batch`` durable atomically; raises StorageError and writes nothing on failure."""
        ...
