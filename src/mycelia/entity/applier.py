"""The node applier: events and states from anywhere become entity state (ARCHITECTURE.md §5).

Four ways in, one staging discipline (:meth:`Applier.staging`):

- :meth:`~Applier.ingest` — events from peers or files, in any order: grouped by entity,
  sorted topologically (wire order is never trusted), **admitted** (each generation is
  computed from parents that must be known for the same entity — staged earlier in the
  batch, stored, or named in the head of a snapshot held here; a genesis must bind this
  node's system root; an event with unknown parents is **held** in the
  :class:`PendingPool` and its parents reported missing), then placed against the head
  (:mod:`mycelia.entity.placement`: by comparison where nothing cheaper decides);
- :meth:`~Applier.commit_local` — a local transaction's events. They are *fresh*: made
  here just now on a fork whose head this node held, so no other event descends from
  them. Their generations come from the fork's head and they are placed without a walk
  (the tips they name leave the head, they join it), even if the head has moved on since
  the fork — a snapshot from the durable peer may have replaced the fork's head with
  descendants this node holds no events of (the race of the client-side issue). Such a
  snapshot may descend from the very same event, made by another node with the same edit
  on the same head: where that is possible, the head is marked unsure (durably, with the
  commit) and later tidied (:mod:`mycelia.entity.unsure`);
- :meth:`~Applier.ingest_states` — state snapshots from a durable peer, merged (every
  backend is a state CRDT; the head is decided by comparison);
- :meth:`~Applier.reset` — an ephemeral node replaces entities with its durable peer's
  state (a refused commit is reverted, ARCHITECTURE.md §7) and replays its own kept
  commits on top.

Staging: a run takes the entity locks in sorted order (no deadlock between runs), plans
in memory, runs the caller's check (policy) on every changed entity before anything is
durable, and on normal exit makes events, states and meta records durable in **one**
storage write, then tells the node (``on_change``) what changed — still holding the
locks, so listeners hear of one entity's changes in the order they were committed,
whatever else runs concurrently. On any error every entity the run touched is evicted
from memory, so memory never runs ahead of storage, and nothing is persisted. Until its
write returns, a run's residents are ahead of storage: what is sent to a peer is read
through :meth:`Applier.settled`, which waits for the run.

``atomic=True`` (a remote commit) makes an :meth:`ingest` batch succeed or fail together;
otherwise a bad entity is reported in :attr:`IngestResult.errors` and the others proceed.
An event already stored is a no-op.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence

from mycelia.entity.admission import admit, admit_fresh, by_entity
from mycelia.entity.entity import Entity
from mycelia.entity.loading import ResidentLoader
from mycelia.entity.locks import EntityLocks
from mycelia.entity.lookups import HeadLookups
from mycelia.entity.pending import PendingPool
from mycelia.entity.placement import Placement
from mycelia.entity.residents import Residents
from mycelia.entity.runs import (
    NEW_ENTITY,
    EntityChange,
    EventCheck,
    ForkBase,
    IngestResult,
    Meta,
    Plan,
    Refused,
    Run,
    Staging,
    fetched,
)
from mycelia.entity.snapshots import adopted, merged_plan, replaced
from mycelia.entity.unsure import UnsureHeads
from mycelia.errors import CommitReverted, MyceliaError
from mycelia.event_dag import DEFAULT_BUDGET
from mycelia.proto import (
    DEFAULT_LIMITS,
    AdmittedEvent,
    Clock,
    EntityId,
    EntityState,
    Event,
    EventId,
)
from mycelia.retrieval import EntityStore, RemoteEvents, StagingMap

__all__ = ["Applier", "EntityChange", "EventCheck", "ForkBase", "IngestResult"]

log = logging.getLogger(__name__)


class Applier:
    """Turns events into entity state and durable storage, one entity lock at a time."""

    def __init__(
        self,
        store: EntityStore,
        residents: Residents,
        *,
        durable: bool,
        system_root: Callable[[], EntityId | None],
        remote: RemoteEvents | None = None,
        on_change: Callable[[list[EntityChange]], None] | None = None,
        pending: PendingPool | None = None,
        budget: int = DEFAULT_BUDGET,
        max_entity_bytes: int = DEFAULT_LIMITS.max_entity_bytes,
        sole_writer: bool = True,
    ) -> None:
        self._store = store
        self._max_entity_bytes = max_entity_bytes
        """An entity may not grow past this (its snapshot must fit one frame)."""
        self._residents = residents
        self._durable = durable
        self._loader = ResidentLoader(store, residents, durable=durable)
        self.load = self._loader.load
        """The resident entity, loading its stored state if needed (``None`` if unknown)."""
        self._system_root = system_root
        self._remote = remote
        """An ephemeral node's durable peer, asked for history it does not hold."""
        self._on_change = on_change or _ignore
        """Told of every write's changes, right after it (under the entities' locks)."""
        self._pending = pending if pending is not None else PendingPool()
        self._budget = budget
        self._placement = Placement(
            store, durable=durable, sole_writer=sole_writer, remote=remote, budget=budget
        )
        """Where remote events go against a head (``sole_writer``: whether only this applier
        writes ``store``; see :mod:`mycelia.entity.placement`)."""
        self._lookups = HeadLookups(self.load, self._placement, durable=durable)
        """What to look up before admitting events (:mod:`mycelia.entity.lookups`)."""
        self.locks = EntityLocks()
        """The locks that serialise changes to each entity (while they are used)."""
        self._epochs: dict[EntityId, int] = {}
        self.unsure = UnsureHeads(
            staging=self.staging,
            load=self.load,
            placement=self._placement,
            residents=residents,
            epochs=self._epochs,
            budget=budget,
        )
        """The heads a local commit may have left holding an ancestor of another tip, and
        their tidying (:mod:`mycelia.entity.unsure`; only where a durable peer can tell)."""

    @property
    def pending(self) -> PendingPool:
        """Events held for missing parents."""
        return self._pending

    async def settled(self, entity_id: EntityId) -> Entity | None:
        """:meth:`load` once no staging run holds the entity. A run changes the resident
        before its write is durable (and evicts it if the write fails), so what a node
        tells a peer is read here: never a change it could still lose (ARCHITECTURE.md
        §7). The entity is as written only until the caller's next await: take what it
        needs from it at once."""
        async with self.locks.held(entity_id):
            return await self.load(entity_id)

    def base(self, entity: Entity) -> ForkBase:
        """What a transaction forking ``entity`` now starts from (give it to commit_local)."""
        return ForkBase(entity.head_generations, self._epochs.get(entity.entity_id, 0))

    def staging(
        self,
        entity_ids: Iterable[EntityId],
        result: IngestResult,
        *,
        meta: Meta = (),
        forget: tuple[EntityId, ...] = (),
    ) -> Staging:
        """A staging run over ``entity_ids`` (``async with``): locks taken in sorted order;
        plans added to the run are written in one storage write on normal exit (with
        ``meta`` and ``forget``, reported in ``result``); on any error every entity is
        evicted from memory and nothing is written."""
        ids = sorted(set(entity_ids))  # one global order: no deadlock between runs
        return Staging(
            Run(meta, forget),
            ids,
            result,
            locks=self.locks,
            write=self._write,
            evict=self._residents.evict,
        )

    async def _write(self, run: Run, result: IngestResult) -> None:
        if not (run.plans or run.meta or run.forget):
            return
        batch = run.batch(max_entity_bytes=self._max_entity_bytes)
        await self._store.write(batch)
        result.stored += batch.events
        for changes in run.changes():
            result.changes += changes
            self._on_change(changes)

    # -- events from anywhere ------------------------------------------------------------

    async def ingest(
        self,
        events: Iterable[Event],
        *,
        atomic: bool = False,
        check: EventCheck | None = None,
        meta: Meta = (),
    ) -> IngestResult:
        """Admit, apply and commit ``events`` (any order, duplicates welcome).

        ``meta`` records are written in the same storage write as the first batch.
        Raises (atomic runs, or any run's storage failure) the first MyceliaError; in
        non-atomic runs refused entities are reported in the result instead.
        """
        result = IngestResult()
        batch = list(events)
        while batch:
            await self._ingest_once(batch, atomic=atomic, check=check, result=result, meta=meta)
            meta = ()
            # Events that waited for what was just admitted get their turn now.
            batch = self._pending.release(e.id for e in result.stored)
            atomic = False
        result.missing -= {e.id for e in result.stored}
        return result

    async def commit_many(
        self,
        commits: Sequence[Sequence[Event]],
        *,
        check: EventCheck | Sequence[EventCheck | None] | None = None,
        parts: Sequence[int] = (),
    ) -> IngestResult:
        """Commit several commits, in this order, in **one** storage write: one peer's, or
        several peers' combined (:mod:`mycelia.node.combining`).

        Each commit is admitted, placed and checked on its own, against the entities as the
        commits before it left them (so a check sees each commit's own before and after),
        and each must be complete (atomic: no event of it may wait for parents). ``check``
        is one check for every commit, or one per commit (each peer's credentials).
        ``parts`` counts each peer's commits, in order, when several peers' are combined:
        listeners hear of each peer's changes apart, as if written alone, and a commit's
        own refusal (admission, placement, check) comes as :class:`Refused`, naming its
        place. Raises the first error and writes nothing then. Events that were waiting
        for these are applied afterwards."""
        result = IngestResult()
        entities = {e.entity_id for commit in commits for e in commit}
        checks = check if isinstance(check, Sequence) else [check] * len(commits)
        ends = set(itertools.accumulate(parts))
        async with self.staging(entities, result) as run:
            earlier: dict[EventId, AdmittedEvent] = {}
            for index, (events, check_one) in enumerate(zip(commits, checks, strict=True)):
                try:
                    await self._plan_one(events, check_one, run, result, earlier)
                except MyceliaError as exc:
                    if parts:  # several peers' commits: whose was refused?
                        raise Refused(index, exc) from exc
                    raise
                if index + 1 in ends:
                    run.end_part()
        released = self._pending.release(e.id for e in result.stored)
        if released:
            more = await self.ingest(released)
            result.changes.extend(more.changes)
            result.stored.extend(more.stored)
        return result

    async def _plan_one(
        self,
        events: Sequence[Event],
        check: EventCheck | None,
        run: Run,
        result: IngestResult,
        earlier: dict[EventId, AdmittedEvent],
    ) -> None:
        """Plan one commit of :meth:`commit_many` into ``run``, after the ``earlier`` ones."""
        groups = by_entity(events)
        unsure = {i: g for i, g in groups.items() if not await self._lookups.needless(i, g)}
        wanted = await self._lookups.ids(unsure)
        asked = wanted - earlier.keys()
        known = dict(await self._store.get_events(asked)) if asked else {}
        known.update((i, earlier[i]) for i in wanted if i in earlier)
        for entity_id, group in groups.items():
            plan = await self._plan(entity_id, group, known, result, atomic=True, earlier=earlier)
            run.add(plan, check)
            if plan is not None:
                earlier.update((e.id, e) for e in plan.staged)

    async def _ingest_once(
        self,
        events: Sequence[Event],
        *,
        atomic: bool,
        check: EventCheck | None,
        result: IngestResult,
        meta: Meta,
    ) -> None:
        groups = by_entity(events)
        async with self.staging(groups, result, meta=meta) as run:
            known = await self._store.get_events(await self._lookups.ids(groups))
            for entity_id, group in groups.items():
                try:
                    run.add(await self._plan(entity_id, group, known, result, atomic=atomic), check)
                except MyceliaError as exc:
                    self._residents.evict(entity_id)
                    if atomic:
                        raise
                    log.info("refused events for entity %s: %s", entity_id, exc)
                    result.errors[entity_id] = exc

    async def _plan(
        self,
        entity_id: EntityId,
        group: list[Event],
        known: Mapping[EventId, AdmittedEvent],
        result: IngestResult,
        *,
        atomic: bool,
        earlier: Mapping[EventId, AdmittedEvent] | None = None,
    ) -> Plan | None:
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
        getter = self._placement.getter(entity_id, staging, earlier)
        applied, head = await self._placement.place(entity, staged, getter)
        staged = [*staged, *(e for e in fetched(getter) if e.id not in staging)]
        changed: set[str] = set()
        for event in applied:
            changed |= entity.apply(event)
        if applied:
            if head is None:
                entity.advance(applied)
            else:
                entity.set_head(head)
            self._residents.put(entity)
        return Plan(entity, before, staged, applied, changed)

    # -- a local transaction ---------------------------------------------------------------

    async def commit_local(
        self,
        events: Sequence[Event],
        *,
        bases: Mapping[EntityId, ForkBase],
        check: EventCheck | None = None,
        record: Callable[[list[AdmittedEvent]], Meta] | None = None,
    ) -> IngestResult:
        """Commit one local transaction's fresh events atomically (see the module docstring).

        ``bases`` holds each edited entity's :class:`ForkBase` (an entity the transaction
        created needs none). ``record`` is called with the events to store, once planned
        and checked; the meta records it returns are written with them (the outbox).
        Raises CommitReverted if an entity was reset since its fork, the check's
        PolicyDenied, or StorageError; nothing is written then.
        """
        result = IngestResult()
        groups = by_entity(events)
        async with self.staging(groups, result) as run:
            work = []
            unsure: list[EventId] = []
            for entity_id, group in groups.items():
                base = bases.get(entity_id, NEW_ENTITY)
                if self._epochs.get(entity_id, 0) != base.epoch:
                    raise CommitReverted(
                        f"entity {entity_id} was reverted to the durable peer's state while "
                        "this transaction was open: nothing was committed; redo the edit"
                    )
                entity = await self.load(entity_id)
                if entity is None:
                    entity = Entity.empty(entity_id, group[0].collection)
                if not await self._lookups.surely_new(entity, base.head):
                    unsure += (e.id for e in group)
                work.append((entity, group, base))
            # An event already stored is a no-op (a retried commit): ask storage about the
            # events that may be (on LMDB a lookup costs a round trip for the GIL).
            known = await self._store.get_events(unsure) if unsure else {}
            for entity, group, base in work:
                run.add(self._plan_fresh(entity, group, base, known), check)
            run.meta = (*run.meta, *self.unsure.records(groups))
            if record is not None:
                run.meta = (*run.meta, *record([e for p in run.plans for e in p.staged]))
        return result

    def _plan_fresh(
        self,
        entity: Entity,
        group: list[Event],
        base: ForkBase,
        known: Mapping[EventId, AdmittedEvent],
    ) -> Plan | None:
        staged = admit_fresh(entity, group, known, parents=base.head, root=self._system_root())
        if not staged:
            return None
        before = entity.snapshot()
        if self._remote is not None:  # the same edit made elsewhere may be below its head
            self.unsure.note(entity, base.head, staged)
        changed: set[str] = set()
        for event in staged:
            changed |= entity.apply(event)
        if not entity.exists:
            entity.history_closed = True
        entity.advance(staged)
        self._residents.put(entity)
        return Plan(entity, before, staged, staged, changed)

    # -- snapshots -----------------------------------------------------------------------

    async def ingest_states(
        self, states: Sequence[EntityState], *, bases: Mapping[EntityId, Clock] | None = None
    ) -> IngestResult:
        """Merge state snapshots from a peer (ARCHITECTURE.md §7: a snapshot, not events).

        Every backend is a state-based CRDT, so merging is always correct for the values;
        the head becomes the maximal ids of both heads (by comparison; without the history
        to decide, both heads are kept, which later comparisons handle). ``bases`` holds,
        per entity, a head its snapshot strictly descends from, on a trusted peer's word:
        while the entity here has exactly that head, the snapshot's head is taken without a
        comparison (pass only what an ephemeral node's durable peer said). An older or equal
        snapshot is a no-op. All the merged states are written at once. A snapshot that does
        not fit is left out and reported in ``errors`` (DecodeError for a malformed buffer,
        InvalidEvent for another collection; on an ephemeral node, EventNotFound when the
        history to place it cannot be fetched now: the peer's next answer brings it again).
        """
        bases, result = bases or {}, IngestResult()
        by_id = {s.entity_id: s for s in states}
        async with self.staging(by_id, result) as run:
            held = await self._loader.load_many(by_id)
            cache = not self._durable
            for entity_id, incoming in by_id.items():
                entity = held.get(entity_id)
                try:
                    if entity is None:  # (the common case of a fresh client: no walk)
                        run.add(self._resident(adopted(incoming, cache=cache)))
                    else:
                        run.add(await self._merge_state(entity, incoming, bases.get(entity_id)))
                except MyceliaError as exc:
                    self._residents.evict(entity_id)
                    log.info("refused a snapshot of %s: %s", entity_id, exc)
                    result.errors[entity_id] = exc
        return result

    async def _merge_state(
        self, entity: Entity, incoming: EntityState, base: Clock | None
    ) -> Plan | None:
        entity_id = incoming.entity_id
        plan = await merged_plan(
            entity,
            incoming,
            base,
            lambda: self._placement.getter(entity_id, StagingMap()),
            self._store,
            budget=self._budget,
            fetching=self._remote is not None,
            cache=not self._durable,
        )
        return None if plan is None else self._resident(plan)

    async def reset(
        self,
        replacements: Mapping[EntityId, EntityState | None],
        *,
        replay: Sequence[AdmittedEvent] = (),
        meta: Meta = (),
    ) -> IngestResult:
        """Replace entities with a durable peer's state (``None``: the peer has none), then
        replay ``replay`` — this node's own commits on them that the peer does not hold,
        fresh for it, parents first — on top; in one write, with ``meta``.

        Only an ephemeral node resets (its store is a cache): each entity is forgotten whole
        and rebuilt, and a transaction that forked it before fails with CommitReverted. The
        change reported goes from what this node showed to the result.
        """
        result = IngestResult()
        forget = tuple(sorted(replacements))
        async with self.staging(forget, result, meta=meta, forget=forget) as run:
            for entity_id, state in replacements.items():
                current = await self.load(entity_id)
                self._epochs[entity_id] = self._epochs.get(entity_id, 0) + 1
                plan = replaced(entity_id, state, current, replay, cache=not self._durable)
                if plan is not None:
                    run.add(self._resident(plan))
        return result

    def _resident(self, plan: Plan) -> Plan:
        """Make a standing entity the resident; drop any other (and an :class:`Adopted`)."""
        entity = plan.entity
        if isinstance(entity, Entity) and entity.exists:
            self._residents.put(entity)
        else:
            self._residents.evict(entity.entity_id)
        return plan


def _ignore(changes: list[EntityChange]) -> None:
    """The default listener: nobody to tell."""
