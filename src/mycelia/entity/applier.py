"""The node applier: events and states from anywhere become entity state (ARCHITECTURE.md §5).

The ingest discipline, for any batch (one event, a remote commit, a bridge):

1. group by entity; sort each group topologically (wire order is never trusted);
2. **admit**: compute each new event's generation from its parents, which must be known —
   staged earlier in the batch, stored, or named in the head of a snapshot this node holds
   — and must belong to the same entity; a genesis must bind this node's system root.
   An event with unknown parents is **held** (:class:`PendingPool`) and its parents are
   reported as missing; a parent from another entity is rejected;
3. **stage** the admitted events and compare them with the entity's head; the verdict
   table (:mod:`mycelia.entity.verdicts`) says what to do; apply every event the head
   lacks, parents first, and set the head to the comparison's merged head (an antichain);
4. run the caller's check (policy) on every changed entity before anything is durable;
5. **commit** events and states in one storage write. If anything fails after step 3,
   every entity this run touched is evicted from memory, so memory never runs ahead of
   storage, and nothing is persisted.

``atomic=True`` (a remote commit, a local transaction) makes the whole batch succeed or
fail together; otherwise a bad entity is reported in :attr:`IngestResult.errors` and the
others proceed. An event already stored is a no-op.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

from mycelia.entity.admission import admit
from mycelia.entity.entity import Entity, Snapshot
from mycelia.entity.pending import PendingPool
from mycelia.entity.residents import Residents
from mycelia.entity.verdicts import Action, action_for, head_after, rejection
from mycelia.errors import (
    EventNotFound,
    InvalidEvent,
    MyceliaError,
)
from mycelia.event_dag import (
    DEFAULT_BUDGET,
    compare,
    missing,
)
from mycelia.proto import (
    AdmittedEvent,
    Clock,
    EntityId,
    EntityState,
    Event,
    EventId,
)
from mycelia.retrieval import (
    CachedGetter,
    EntityStore,
    LocalGetter,
    RemoteEvents,
    StagingMap,
    StoredState,
    WriteBatch,
)

__all__ = ["Applier", "EntityChange", "EventCheck", "IngestResult"]

log = logging.getLogger(__name__)


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


EventCheck = Callable[[Snapshot, Snapshot, AdmittedEvent], None]
"""A policy hook run before durability: (before, after, event); raise PolicyDenied to refuse."""


@dataclass(slots=True)
class _Plan:
    entity: Entity
    before: Snapshot
    staged: list[AdmittedEvent]
    applied: list[AdmittedEvent]
    changed: set[str]


class Applier:
    """Turns events into entity state and durable storage, one entity lock at a time."""

    def __init__(
        self,
        store: EntityStore,
        residents: Residents,
        *,
        durable: bool,
        system_root: Callable[[], EntityId | None],
        pending: PendingPool | None = None,
        budget: int = DEFAULT_BUDGET,
    ) -> None:
        self._store = store
        self._residents = residents
        self._durable = durable
        self._system_root = system_root
        self._pending = pending if pending is not None else PendingPool()
        self._budget = budget
        self._locks: dict[EntityId, asyncio.Lock] = {}
        self.remote: RemoteEvents | None = None
        """An ephemeral node's durable peer, asked for history it does not hold."""

    @property
    def pending(self) -> PendingPool:
        """Events held for missing parents."""
        return self._pending

    async def ingest(
        self,
        events: Iterable[Event],
        *,
        atomic: bool = False,
        check: EventCheck | None = None,
        meta: tuple[tuple[str, bytes | None], ...] = (),
        dry_run: bool = False,
    ) -> IngestResult:
        """Admit, apply and commit ``events`` (any order, duplicates welcome).

        ``meta`` records are written in the same storage write as the first batch.
        ``dry_run`` does everything but the write (and forgets what it applied): the checks
        run, the errors are raised, nothing changes.
        Raises (atomic runs, or any run's storage failure) the first MyceliaError; in
        non-atomic runs refused entities are reported in the result instead.
        """
        result = IngestResult()
        batch = list(events)
        while batch:
            await self._ingest_once(
                batch, atomic=atomic, check=check, result=result, meta=meta, dry_run=dry_run
            )
            if dry_run:
                return result
            meta = ()
            # Events that waited for what was just admitted get their turn now.
            batch = self._pending.release(e.id for e in result.stored)
            atomic = False
        result.missing -= {e.id for e in result.stored}
        return result

    async def ingest_state(self, incoming: EntityState) -> IngestResult:
        """Merge one state snapshot from a peer; see :meth:`ingest_states`."""
        return await self.ingest_states([incoming])

    async def ingest_states(
        self, states: Sequence[EntityState], *, bases: Mapping[EntityId, Clock] | None = None
    ) -> IngestResult:
        """Merge state snapshots from a peer (ARCHITECTURE.md §7: a snapshot, not events).

        Every backend is a state-based CRDT, so merging is always correct for the values;
        the head becomes the maximal ids of both heads (by comparison; if the history
        needed to decide is not here, both heads are kept, which later comparisons handle).
        ``bases`` holds, per entity, a head its snapshot strictly descends from, on the
        word of a trusted peer: while the entity here has exactly that head, the
        snapshot's head is taken without a comparison (pass only what the durable peer of
        an ephemeral node said). An older or equal snapshot is a no-op. All the merged
        states are written at once. Raises DecodeError for malformed buffers and
        InvalidEvent for a snapshot that contradicts the entity (another collection);
        nothing is written then.
        """
        bases = bases or {}
        result = IngestResult()
        by_id = {s.entity_id: s for s in states}
        async with AsyncExitStack() as stack:
            for entity_id in sorted(by_id):
                await stack.enter_async_context(self.lock(entity_id))
            plans: list[_Plan] = []
            try:
                for incoming in by_id.values():
                    plan = await self._merge_state(incoming, bases.get(incoming.entity_id))
                    if plan is not None:
                        plans.append(plan)
            except BaseException:
                for entity_id in by_id:
                    self._residents.evict(entity_id)
                raise
            await self._commit(plans, result, states_only=True)
        return result

    async def _merge_state(self, incoming: EntityState, base: Clock | None) -> _Plan | None:
        entity_id = incoming.entity_id
        entity = await self.load(entity_id)
        if entity is not None and incoming.collection != entity.collection:
            raise InvalidEvent(
                f"snapshot of {entity_id} names collection {incoming.collection!r}, "
                f"not {entity.collection!r}"
            )
        if entity is None or not entity.exists:
            fresh = Entity.from_state(incoming)
            before = Entity.empty(entity_id, incoming.collection).snapshot()
            self._residents.put(fresh)
            return _Plan(fresh, before, [], [], set(fresh.values()))
        before = entity.snapshot()
        if base is not None and entity.head == base:
            changed = entity.merge_state(incoming)
            entity.set_head(incoming.state.head_generations())
            self._residents.put(entity)
            return _Plan(entity, before, [], [], changed)
        getter = self._getter(entity_id, StagingMap())
        head = await self._merged_head(entity, incoming, getter)
        if head is None:
            return None
        changed = entity.merge_state(incoming)
        entity.set_head(head)
        self._residents.put(entity)
        return _Plan(entity, before, _fetched(getter), [], changed)

    async def _merged_head(
        self, entity: Entity, incoming: EntityState, getter: LocalGetter
    ) -> dict[EventId, int] | None:
        """The head after merging ``incoming`` (``None``: it adds nothing)."""
        hints = {**entity.head_generations, **incoming.state.head_generations()}
        try:
            outcome = await compare(
                getter, incoming.state.head, entity.head, budget=self._budget, hints=hints
            )
        except EventNotFound:
            log.info(
                "merging a snapshot of %s without its history: keeping both heads", entity.entity_id
            )
            return hints
        action = action_for(outcome.relation)
        if action is Action.NOTHING:
            return None
        if action is Action.REJECT:
            raise rejection(outcome.relation, entity.entity_id)
        return dict(outcome.merged_head)

    async def load(self, entity_id: EntityId) -> Entity | None:
        """The resident entity, loading its stored state if needed (``None`` if unknown)."""
        entity = self._residents.get(entity_id)
        if entity is None:
            stored = await self._store.get_state(entity_id)
            if stored is not None:
                entity = self._residents.put(Entity.from_state(stored))
        return entity

    def _getter(self, entity_id: EntityId, staging: StagingMap) -> LocalGetter:
        """Staging and storage, then (on an ephemeral node with a peer) the peer."""
        if self.remote is None:
            return LocalGetter(staging, self._store, definitive=self._durable)
        return CachedGetter(staging, self._store, self.remote, entity_id=entity_id)

    def lock(self, entity_id: EntityId) -> asyncio.Lock:
        """The lock that serialises changes to one entity."""
        lock = self._locks.get(entity_id)
        if lock is None:
            lock = self._locks[entity_id] = asyncio.Lock()
        return lock

    async def _ingest_once(
        self,
        events: Sequence[Event],
        *,
        atomic: bool,
        check: EventCheck | None,
        result: IngestResult,
        meta: tuple[tuple[str, bytes | None], ...],
        dry_run: bool = False,
    ) -> None:
        groups: dict[EntityId, list[Event]] = {}
        for event in events:
            groups.setdefault(event.entity_id, []).append(event)
        async with AsyncExitStack() as stack:
            for entity_id in sorted(groups):  # one global order: no deadlock between runs
                await stack.enter_async_context(self.lock(entity_id))
            wanted = {e.id for e in events} | {p for e in events for p in e.parent}
            known = await self._store.get_events(wanted)
            plans: list[_Plan] = []
            for entity_id, group in groups.items():
                try:
                    plan = await self._plan(entity_id, group, known, result, atomic=atomic)
                    if plan is not None and check is not None:
                        after = plan.entity.snapshot()
                        for applied in plan.applied:
                            check(plan.before, after, applied)
                except MyceliaError as exc:
                    self._residents.evict(entity_id)
                    if atomic:
                        for plan in plans:
                            self._residents.evict(plan.entity.entity_id)
                        raise
                    log.info("refused events for entity %s: %s", entity_id, exc)
                    result.errors[entity_id] = exc
                    continue
                if plan is not None:
                    plans.append(plan)
            if dry_run:
                for plan in plans:
                    self._residents.evict(plan.entity.entity_id)
                return
            await self._commit(plans, result, meta=meta)

    async def _commit(
        self,
        plans: list[_Plan],
        result: IngestResult,
        *,
        states_only: bool = False,
        meta: tuple[tuple[str, bytes | None], ...] = (),
    ) -> None:
        if not plans:
            return
        events = tuple(e for plan in plans for e in plan.staged)
        states = tuple(
            StoredState(p.entity.to_state(), p.entity.snapshot().values)
            for p in plans
            if p.applied or states_only
        )
        try:
            await self._store.write(WriteBatch(events=events, states=states, meta=meta))
        except BaseException:
            for plan in plans:
                self._residents.evict(plan.entity.entity_id)
            raise
        result.stored.extend(events)
        for plan in plans:
            # A snapshot that only moves the head, or creates an entity with no values yet,
            # is still a change: live queries and subscribers must hear of it.
            moved = plan.changed or plan.before.head != plan.entity.head
            if plan.applied or (states_only and moved):
                result.changes.append(
                    EntityChange(
                        plan.before,
                        plan.entity.snapshot(),
                        tuple(plan.applied),
                        frozenset(plan.changed),
                    )
                )

    async def _plan(
        self,
        entity_id: EntityId,
        group: list[Event],
        known: Mapping[EventId, AdmittedEvent],
        result: IngestResult,
        *,
        atomic: bool,
    ) -> _Plan | None:
        entity = await self.load(entity_id)
        if entity is None:
            entity = Entity.empty(entity_id, group[0].collection)
        admission = admit(entity, group, known, root=self._system_root(), atomic=atomic)
        for waiting, missing_ids in admission.held:
            self._pending.hold(waiting, missing_ids)
            result.held.append(waiting.id)
            result.missing.update(missing_ids)
        staging = admission.staging
        if not staging:
            return None
        staged = staging.staged()
        before = entity.snapshot()
        getter = self._getter(entity_id, staging)
        applied, head = await self._place(entity, staged, getter)
        staged = [*staged, *(e for e in _fetched(getter) if e.id not in staging)]
        changed: set[str] = set()
        try:
            for event in applied:
                changed |= entity.apply(event)
        except MyceliaError:
            self._residents.evict(entity_id)
            raise
        if applied:
            entity.set_head(head)
            self._residents.put(entity)
        return _Plan(entity, before, staged, applied, changed)

    async def _place(
        self, entity: Entity, staged: list[AdmittedEvent], getter: LocalGetter
    ) -> tuple[list[AdmittedEvent], Mapping[EventId, int]]:
        """Which staged events the head lacks (parents first), and the head after them."""
        if not entity.exists:
            if not any(e.event.is_genesis for e in staged):
                raise InvalidEvent(
                    f"events for entity {entity.entity_id}, which does not exist here "
                    "(its genesis was never received)"
                )
            parents = {p for e in staged for p in e.parent}
            return staged, {e.id: e.generation for e in staged if e.id not in parents}
        if len(staged) == 1 and all(p in entity.head for p in staged[0].parent):
            # One new event made on tips of this head (on exactly the head: the linear
            # case; on some tips: a writer that missed concurrent work). The head lacks
            # just it, and the tips it names are now its ancestors: no walk is needed.
            return staged, head_after(entity.head_generations, staged)
        # A subject-side walk: the events the head lacks, without walking the head's own
        # branches (admission already keeps foreign lineage out: parents are this entity's).
        outcome = await missing(
            getter,
            Clock(e.id for e in staged),
            entity.head,
            budget=self._budget,
            hints=entity.head_generations,
            known=staged,
        )
        action = action_for(outcome.relation)
        if action is Action.NOTHING:
            return [], entity.head_generations
        if action is Action.REJECT:
            raise rejection(outcome.relation, entity.entity_id)
        applied = list(outcome.subject_only)
        return applied, head_after(entity.head_generations, applied)


def _fetched(getter: LocalGetter) -> list[AdmittedEvent]:
    """Events a cached getter fetched from the peer (stored with the result)."""
    return getter.fetched() if isinstance(getter, CachedGetter) else []
