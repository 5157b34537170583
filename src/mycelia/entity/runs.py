"""What one applier run plans, checks and reports (see :meth:`Applier.staging`).

Invariants:

- A :class:`Plan` is one entity's part of a run; it joins the :class:`Run` only after the
  caller's :data:`EventCheck` passed on every event it applies, and its ``after`` snapshot
  is taken then (a later plan of the same run may change the entity further).
- An :class:`EntityChange` is reported only for what the run made durable.
- An :class:`Overlay` shows the events staged earlier in a run above storage, which does
  not hold them until the run's single write.
- A :class:`Staging` holds its entities' locks from before its run is planned until after
  it is written (and reported), and evicts every entity of a run that fails.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType

from mycelia.entity.entity import Entity, Snapshot
from mycelia.entity.locks import EntityLocks
from mycelia.errors import MyceliaError, PayloadTooLarge
from mycelia.proto import AdmittedEvent, Clock, EntityId, EntityState, EventId
from mycelia.retrieval import (
    CachedGetter,
    EventSource,
    LocalGetter,
    StoredState,
    WriteBatch,
    reads_ahead,
)

__all__ = [
    "NEW_ENTITY",
    "Adopted",
    "EntityChange",
    "EventCheck",
    "ForkBase",
    "IngestResult",
    "Meta",
    "Overlay",
    "Plan",
    "Refused",
    "Run",
    "Staging",
    "differing",
    "fetched",
]

Meta = tuple[tuple[str, bytes | None], ...]
"""Meta records written with a run: (key, value), ``None`` deletes."""


@dataclass(frozen=True, slots=True)
class EntityChange:
    """One entity changed by an applier run."""

    before: Snapshot
    after: Snapshot
    events: tuple[AdmittedEvent, ...]
    """The events applied, parents first."""
    changed: frozenset[str]
    """Properties whose values changed."""


@dataclass(slots=True)
class IngestResult:
    """What an applier run did."""

    changes: list[EntityChange] = field(default_factory=list)
    stored: list[AdmittedEvent] = field(default_factory=list)
    """Events made durable by this run (new to this node)."""
    held: list[EventId] = field(default_factory=list)
    """Events waiting for parents (see :attr:`missing`)."""
    missing: set[EventId] = field(default_factory=set)
    """Parent ids nobody here has: ask a peer for them."""
    errors: dict[EntityId, MyceliaError] = field(default_factory=dict)
    """Entities whose events were refused (non-atomic runs only)."""

    def raise_first(self) -> None:
        """Raise the first error, if any."""
        for error in self.errors.values():
            raise error


class Refused(Exception):
    """Commit ``index`` of a run of several peers' (:meth:`Applier.commit_many` given
    ``parts``) was refused with ``error``: the run wrote nothing, and the commits before it
    passed, against the entities as the earlier ones left them."""

    def __init__(self, index: int, error: MyceliaError) -> None:
        super().__init__(index, error)
        self.index = index
        self.error = error


EventCheck = Callable[[Snapshot, Snapshot, AdmittedEvent], None]
"""A policy hook run before durability: (before, after, event); raise PolicyDenied to refuse."""


@dataclass(frozen=True, slots=True)
class ForkBase:
    """What a transaction's fork of an entity started from (see :meth:`Applier.base`)."""

    head: Mapping[EventId, int]
    """The fork's head, id → generation: the parents (and generations) of its event."""
    epoch: int
    """The entity's reset count when forked: a reset since then voids the fork."""


NEW_ENTITY = ForkBase({}, 0)
"""The base of an entity created by the transaction itself."""


class Adopted:
    """An entity a cache adopts whole from its durable peer's snapshot, as a plan holds it:
    the state as sent and its values, decoded once. It is written as it is and never made
    resident: the applier builds the :class:`Entity` from storage when it is first loaded
    (a fresh client adopts a thousand at once and edits a few)."""

    __slots__ = ("_snapshot", "_state")

    def __init__(self, state: EntityState, values: dict[str, object]) -> None:
        self._state = state
        self._snapshot = Snapshot(
            state.entity_id, state.collection, state.state.head, MappingProxyType(values)
        )

    @property
    def entity_id(self) -> EntityId:
        """The entity's id."""
        return self._state.entity_id

    @property
    def exists(self) -> bool:
        """Whether the state has a head (a snapshot of a created entity)."""
        return self._snapshot.exists

    def snapshot(self) -> Snapshot:
        """The entity's values at the state's head."""
        return self._snapshot

    def to_state(self) -> EntityState:
        """The state as sent."""
        return self._state


@dataclass(slots=True)
class Plan:
    entity: Entity | Adopted
    before: Snapshot
    staged: list[AdmittedEvent]
    """Events to store (new to this node)."""
    applied: list[AdmittedEvent]
    """Events applied to the entity, parents first."""
    changed: set[str]
    snapshot: bool = False
    """A merged or replaced state: written (and reported) even when no event applied."""
    after: Snapshot | None = None
    """The entity as this plan left it (taken when the plan joins its run: a later plan of
    the same run may change the entity further)."""


@dataclass(slots=True)
class Run:
    """One staging run's plans and what is written with them (see :meth:`Applier.staging`)."""

    meta: Meta
    forget: tuple[EntityId, ...]
    plans: list[Plan] = field(default_factory=list)
    parts: list[int] = field(default_factory=list)
    """Plan counts that end a part of the run told apart (see :meth:`end_part`)."""

    def add(self, plan: Plan | None, check: EventCheck | None = None) -> None:
        """Keep ``plan`` for the write, after ``check`` passed on every applied event."""
        if plan is None:
            return
        after = plan.after = plan.entity.snapshot()
        if check is not None:
            for applied in plan.applied:
                check(plan.before, after, applied)
        self.plans.append(plan)

    def batch(self, *, max_entity_bytes: int) -> WriteBatch:
        """The run's one storage write: its events, the states of the entities it left
        standing, and its meta records. Raises PayloadTooLarge (nothing written) if it grows
        an entity past ``max_entity_bytes`` (:func:`check_sizes`)."""
        # One pass over the plans (a local commit has one): this runs on every commit.
        events: list[AdmittedEvent] = []
        latest: dict[EntityId, Entity | Adopted] = {}
        bases: dict[EntityId, Clock] = {}  # the head each entity had before the run
        grown: set[EntityId] = set()
        for plan in self.plans:
            events += plan.staged
            entity = plan.entity
            if plan.applied or plan.snapshot:
                if plan.applied:
                    grown.add(entity.entity_id)
                latest[entity.entity_id] = entity
                bases.setdefault(entity.entity_id, plan.before.head)
        states = tuple(
            StoredState(entity.to_state(), entity.snapshot().values)
            for entity in latest.values()
            if entity.exists
        )
        check_sizes(states, grown, max_entity_bytes)
        return WriteBatch(tuple(events), states, self.meta, self.forget, bases)

    def end_part(self) -> None:
        """End a part of the run here: listeners hear of its changes apart from the next
        part's, as if it had been written alone (one peer's commits in a run that combines
        several peers')."""
        self.parts.append(len(self.plans))

    def changes(self) -> list[list[EntityChange]]:
        """What the run changed, once written, per plan, in its parts (one, unless
        :meth:`end_part` cut it). A snapshot that only moves the head, or creates an
        entity with no values yet, is still a change: live queries and subscribers must
        hear of it."""
        parts: list[list[EntityChange]] = []
        start = 0
        for end in [*self.parts, len(self.plans)]:
            changes: list[EntityChange] = []
            for plan in self.plans[start:end]:
                after = plan.after or plan.entity.snapshot()
                if plan.applied or (
                    plan.snapshot and (plan.changed or plan.before.head != after.head)
                ):
                    changes.append(
                        EntityChange(
                            plan.before, after, tuple(plan.applied), frozenset(plan.changed)
                        )
                    )
            if changes:
                parts.append(changes)
            start = end
        return parts


def check_sizes(states: tuple[StoredState, ...], grown: set[EntityId], limit: int) -> None:
    """Refuse a write that grows an entity past ``limit`` bytes (ARCHITECTURE.md §7: its
    snapshot could never be sent): PayloadTooLarge, nothing written.

    A text state is canonicalised only when read (O(document)); an entity whose estimated
    size is within half the limit is not computed for this check (the estimate is the
    bytes of the updates the state merges, which the merge exceeds by a few dozen bytes at
    most)."""
    for stored in states:
        state = stored.state
        if state.entity_id not in grown or state.wire_size(estimate=True) <= limit // 2:
            continue
        size = state.wire_size()
        if size > limit:
            raise PayloadTooLarge(
                f"entity {state.entity_id} would be {size} bytes; an entity "
                f"may be at most {limit} (split it into several)"
            )


class Staging:
    """The context manager of :meth:`Applier.staging` (a plain class: a generator-based
    one and an exit stack cost more than the rest of a one-entity commit's bookkeeping).

    Entering takes the locks of ``ids`` in their order (sorted by the applier: no deadlock
    between runs) and gives the run; a normal exit writes it, still holding the locks; an
    error in the body or the write evicts every entity of ``ids``; the locks go last.
    """

    __slots__ = ("_evict", "_ids", "_locks", "_result", "_taken", "_write", "run")

    def __init__(
        self,
        run: Run,
        ids: list[EntityId],
        result: IngestResult,
        *,
        locks: EntityLocks,
        write: Callable[[Run, IngestResult], Awaitable[None]],
        evict: Callable[[EntityId], None],
    ) -> None:
        self.run = run
        self._ids = ids
        self._result = result
        self._locks = locks
        self._write = write
        self._evict = evict
        self._taken: list[EntityId] = []

    async def __aenter__(self) -> Run:
        taken = self._taken
        try:
            locks = self._locks
            for entity_id in self._ids:
                if not locks.try_acquire(entity_id):  # (a free lock: no coroutine made)
                    await locks.acquire(entity_id)
                taken.append(entity_id)
        except BaseException:
            self._release()
            raise
        return self.run

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc_type is not None:
                self._evict_all()
                return
            try:
                await self._write(self.run, self._result)
            except BaseException:
                self._evict_all()
                raise
        finally:
            self._release()

    def _evict_all(self) -> None:
        for entity_id in self._ids:
            self._evict(entity_id)

    def _release(self) -> None:
        taken, locks = self._taken, self._locks
        while taken:
            locks.release(taken.pop())


class Overlay:
    """Events staged earlier in a run, over storage (which does not hold them yet)."""

    __slots__ = ("_earlier", "_store", "local_reads")

    def __init__(self, earlier: Mapping[EventId, AdmittedEvent], store: EventSource) -> None:
        self._earlier = earlier
        self._store = store
        self.local_reads = not reads_ahead(store)
        """As the store's (:func:`~mycelia.retrieval.reads_ahead`)."""

    async def get_events(
        self, ids: Collection[EventId], *, ahead: int = 0
    ) -> Mapping[EventId, AdmittedEvent]:
        found = {i: self._earlier[i] for i in ids if i in self._earlier}
        rest = [i for i in ids if i not in found]
        if rest:
            found.update(await self._store.get_events(rest, ahead=ahead))
        return found


def differing(before: Snapshot, entity: Entity) -> set[str]:
    after = entity.values()
    return {k for k in before.values.keys() | after.keys() if before.values.get(k) != after.get(k)}


def fetched(getter: LocalGetter) -> list[AdmittedEvent]:
    """Events a cached getter fetched from the peer (stored with the result)."""
    return getter.fetched() if isinstance(getter, CachedGetter) else []
