"""Following the storage's change feed: commits another process wrote reach this node
(ARCHITECTURE.md §6, §7).

A store that several processes write (PostgreSQL) tells each of them about the others'
commits only through its change feed. A node on such a store runs one
:class:`FeedFollower` from the feed offset it opened at:

- it reads the feed in batches (``read_feed``: the rows, with their heads' events in the
  same query) and, once a batch is short (the end of the feed), waits with
  ``wait_for_feed`` (a NOTIFY wakes it; a lost one costs a poll interval, never a
  commit). The PostgreSQL engine answers a read of rows it wrote itself from memory, and
  a wait while it listens without a query, so following this node's own commits costs no
  round trip, and another process's commit one;
- it remembers the last head it knows this node reported for each entity (its own
  commits' and its own refreshes', heard through :meth:`FeedFollower.reported`); a row at
  that head costs nothing more — this node's own writes, mostly;
- it reads and reports only the rows of the collections this node **shows** (``shows``:
  those its live queries and the subscriptions it serves read, asked per batch; ``None``
  when something hears of every change, such as an application's change listener). The
  other rows are skipped: their entities are evicted, so whatever reads them next reads
  the stored state, and their events are not even read (``read_feed``'s
  ``collections``). A server nobody watches a collection through costs nothing per
  commit there but the feed read. A query or subscription that starts after the batch
  was asked reads the stored states, which the batch's rows are already in;
- for the other rows it takes the entities' locks (the applier's, in sorted order, so a
  local commit and a refresh of one entity never interleave and listeners hear of one
  entity's changes in commit order) and reports what changed through ``notify`` — the
  node's one change hook, which feeds its live queries, the subscriptions it serves and
  every listener — as the same :class:`EntityChange` s a local commit produces: from the
  state this node showed to the row's, with the events between them, parents first;
- a resident entity that still shows what was reported is **refreshed** in place: the
  events it lacks (a short walk from the row's head down to its own) are applied to it,
  which every backend makes the stored state. When what this node showed is not known
  (the entity is not resident, or was reloaded from storage since it was reported, or
  the walk failed), the stored state is read and the change starts from nothing — no
  head, no values, no events — so live queries re-evaluate the entity and a subscription
  sends a bridge or a snapshot against what its peer holds. The stored state becomes the
  resident (the residents' LRU bounds what that holds), so the entity's next rows
  refresh it by their events, and the subscriptions send those events as they are; one
  that fails to decode is evicted;
- one batch of rows is reported as one list of changes, in feed order (an entity by its
  last row in the batch);
- a storage error is logged and the batch read again after a back-off (nothing was
  changed); any other failure is logged, the batch's entities are evicted (the next
  reader loads them from storage) and the follower goes on. It ends only when cancelled
  (the node closes).

Stores only one process writes (LMDB holds a lock on its files, memory is private) need
none of it: :func:`follows` says whether a store does.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass
from typing import Final, Protocol, TypeGuard

from mycelia.entity import Entity, EntityChange, Residents, Snapshot
from mycelia.entity.verdicts import head_after
from mycelia.errors import EventNotFound, InvalidArgument, MyceliaError, StorageError
from mycelia.event_dag import DEFAULT_BUDGET, BudgetExceeded, missing
from mycelia.proto import AdmittedEvent, Clock, EntityId, EntityState, EventId
from mycelia.storage import FeedEntry

__all__ = ["BATCH", "REMEMBERED", "FeedFollower", "FeedStore", "follows"]

log = logging.getLogger(__name__)

BATCH: Final = 1000
"""Feed rows read (and reported) at a time."""
REMEMBERED: Final = 65536
"""Entities whose last reported head the follower keeps (least recently changed go first;
a forgotten one is reported from nothing, which costs more, never correctness)."""
AHEAD: Final = 8
"""Most ancestors read ahead per step of the walk between two heads (see ``_NearBy``)."""
IDLE: Final = 30.0
"""Longest wait for the feed before reading it again anyway (seconds)."""
MIN_BACKOFF: Final = 0.05
MAX_BACKOFF: Final = 5.0


class FeedStore(Protocol):
    """What the follower reads: the feed, states and events (a storage engine)."""

    async def read_feed(
        self, offset: int, *, limit: int = 1000, collections: Collection[str] | None = None
    ) -> list[FeedEntry]:
        """Feed rows after ``offset``, ascending, at most ``limit`` (the events the heads
        of ``collections``' rows name read with them, so the :meth:`get_events` that
        follows costs no query; ``None``: every row's)."""
        ...

    async def wait_for_feed(self, offset: int, *, timeout: float) -> bool:
        """Wait for a feed row beyond ``offset``, at most ``timeout`` seconds."""
        ...

    async def last_offset(self) -> int:
        """The newest offset (where a node that opens now starts following)."""
        ...

    async def get_states(self, ids: Collection[EntityId]) -> dict[EntityId, EntityState]:
        """The stored states among ``ids``."""
        ...

    async def get_events(
        self, ids: Collection[EventId], *, ahead: int = 0
    ) -> Mapping[EventId, AdmittedEvent]:
        """The stored events among ``ids`` (plus up to ``ahead`` ancestors)."""
        ...


def follows(storage: object) -> TypeGuard[FeedStore]:
    """Whether other processes may write ``storage``, so a node on it must follow its feed
    (an engine says so with ``shared = True``; InvalidArgument if it then cannot be
    followed: a node on it would never hear of the other processes' commits)."""
    if getattr(storage, "shared", False) is not True:
        return False
    lacking = [m for m in ("read_feed", "wait_for_feed", "last_offset") if not hasattr(storage, m)]
    if lacking:
        raise InvalidArgument(
            f"{type(storage).__name__} says it is shared (other processes write it) but "
            f"has no {' or '.join(lacking)}: a node on it could not follow their commits"
        )
    return True


class _NearBy:
    """The store as an event source whose read-ahead is capped: the walk from a resident's
    head to the stored one is short (the commits of the last moments), and ancestors read
    ahead beyond it would be decoded for nothing."""

    __slots__ = ("_store",)

    def __init__(self, store: FeedStore) -> None:
        self._store = store

    async def get_events(
        self, ids: Collection[EventId], *, ahead: int = 0
    ) -> Mapping[EventId, AdmittedEvent]:
        return await self._store.get_events(ids, ahead=min(ahead, AHEAD))


@dataclass(frozen=True, slots=True)
class _Update:
    """What one feed row brings: events for a resident, or else the stored state."""

    row: FeedEntry
    resident: Entity | None
    events: tuple[AdmittedEvent, ...]
    state: EntityState | None


class FeedFollower:
    """Reports the commits other processes wrote to this node's store (see the module)."""

    def __init__(
        self,
        store: FeedStore,
        *,
        residents: Residents,
        lock: Callable[[EntityId], AbstractAsyncContextManager[None]],
        notify: Callable[[list[EntityChange]], None],
        shows: Callable[[], Collection[str] | None] = lambda: None,
        batch: int = BATCH,
        budget: int = DEFAULT_BUDGET,
    ) -> None:
        self._store = store
        self._residents = residents
        self._lock = lock
        self._notify = notify
        self._shows = shows
        self._batch = batch
        self._budget = budget
        self._reported: OrderedDict[EntityId, Clock] = OrderedDict()
        self.offset = 0
        """The last feed offset read and reported."""

    def reported(self, changes: list[EntityChange]) -> None:
        """Note the heads this node just reported (a change listener of the node)."""
        for change in changes:
            self._remember(change.after.entity_id, change.after.head)

    async def run(self, offset: int) -> None:
        """Follow the feed from ``offset`` until cancelled."""
        self.offset = offset
        backoff = MIN_BACKOFF
        while True:
            try:
                rows = await self._read_feed()
                await self._report(rows)
                if len(rows) < self._batch:  # read to the end: nothing more until it moves
                    await self._store.wait_for_feed(self.offset, timeout=IDLE)
            except StorageError as exc:
                log.warning("reading the change feed failed (%s); retrying in %gs", exc, backoff)
                await asyncio.sleep(backoff)  # a retry back-off, not a wait for a condition
                backoff = min(backoff * 2, MAX_BACKOFF)
            else:
                backoff = MIN_BACKOFF

    async def step(self) -> list[EntityChange]:
        """Read one batch of the feed and report it (or wait for the feed to move);
        returns the changes reported. Raises StorageError, having reported nothing."""
        rows = await self._read_feed()
        if not rows:
            await self._store.wait_for_feed(self.offset, timeout=IDLE)
        return await self._report(rows)

    async def _read_feed(self) -> list[FeedEntry]:
        return await self._store.read_feed(
            self.offset, limit=self._batch, collections=self._shows()
        )

    async def _report(self, rows: Sequence[FeedEntry]) -> list[EntityChange]:
        """Report ``rows`` and move past them (see :meth:`step`)."""
        if not rows:
            return []
        try:
            changes = await self.apply(rows)
        except StorageError:
            raise
        except Exception:  # a bug must not stop the feed: forget what the rows touched
            log.exception("reporting feed rows up to %d failed", rows[-1].offset)
            for row in rows:
                self._residents.evict(row.entity_id)  # the next reader loads it afresh
                self._reported.pop(row.entity_id, None)
            changes = []
        self.offset = rows[-1].offset
        return changes

    async def apply(self, rows: Sequence[FeedEntry]) -> list[EntityChange]:
        """Report what ``rows`` change for this node (see the module docstring)."""
        last: dict[EntityId, FeedEntry] = {}
        for row in rows:
            last.pop(row.entity_id, None)
            last[row.entity_id] = row  # ordered by each entity's last row
        news = [r for r in last.values() if self._reported.get(r.entity_id) != r.head]
        if not news:
            return []
        shows = self._shows()  # asked before any await: a query opened later reads storage
        skipped: list[FeedEntry] = []
        if shows is not None:
            skipped = [r for r in news if r.collection not in shows]
            news = [r for r in news if r.collection in shows]
        async with AsyncExitStack() as stack:
            for entity_id in sorted(r.entity_id for r in news + skipped):  # the applier's order
                await stack.enter_async_context(self._lock(entity_id))
            # Under the locks: this node's own commit of a row, read before the applier
            # reported it, is reported now (it writes and reports under the entity's lock),
            # and its resident is current (before, it was evicted, and read back).
            self._forget(
                [r.entity_id for r in skipped if self._reported.get(r.entity_id) != r.head]
            )
            if not news:
                return []
            updates = await self._read(news)
            changes = [c for c in map(self._update, updates) if c is not None]
            if changes:
                self._notify(changes)  # still holding the locks, as the applier does
                self.reported(changes)
        return changes

    async def _read(self, rows: Sequence[FeedEntry]) -> list[_Update]:
        """What each row brings: the events a resident lacks, or else the stored state.
        Reads everything before anything is changed, so a StorageError changes nothing."""
        rows = [r for r in rows if self._reported.get(r.entity_id) != r.head]  # not meanwhile
        heads = {i for r in rows for i in r.head}
        known = await self._store.get_events(heads) if heads else {}
        updates: list[_Update] = []
        unknown: list[FeedEntry] = []
        for row in rows:
            resident = self._residents.get(row.entity_id)
            shown = self._reported.get(row.entity_id)
            if resident is not None and shown is not None and resident.head == shown:
                events = await self._between(resident, row.head, known)
                if events is not None:
                    updates.append(_Update(row, resident, events, None))
                    continue
            unknown.append(row)
        if unknown:
            states = await self._store.get_states([r.entity_id for r in unknown])
            updates.extend(_Update(r, None, (), states.get(r.entity_id)) for r in unknown)
        updates.sort(key=lambda u: u.row.offset)
        return updates

    def _update(self, update: _Update) -> EntityChange | None:
        """Refresh the resident (or evict it) and return the change (no I/O)."""
        entity_id = update.row.entity_id
        resident = update.resident
        try:
            if resident is not None:  # what this node showed, plus the events it lacked
                if not update.events:
                    return None
                before = resident.snapshot()
                changed: set[str] = set()
                for event in update.events:
                    changed |= resident.apply(event)
                resident.set_head(head_after(resident.head_generations, list(update.events)))
                return EntityChange(before, resident.snapshot(), update.events, frozenset(changed))
            if update.state is None or self._reported.get(entity_id) == update.state.state.head:
                self._residents.evict(entity_id)  # gone (a cache forgot it), or known already
                return None
            entity = Entity.from_state(update.state)
        except MyceliaError as exc:
            log.error("entity %s in the feed does not decode: %s", entity_id, exc)
            self._residents.evict(entity_id)
            return None
        self._residents.put(entity)  # so the entity's next rows refresh it by their events
        after = entity.snapshot()
        before = Snapshot(entity_id, entity.collection, Clock(), {})
        return EntityChange(before, after, (), frozenset(after.values))

    async def _between(
        self, resident: Entity, head: Clock, known: Mapping[EventId, AdmittedEvent]
    ) -> tuple[AdmittedEvent, ...] | None:
        """The events ``head`` has and the resident's head lacks, parents first (``None``:
        not found within the budget)."""
        step = _one_step(resident.head, head, known)
        if step is not None:
            return step
        try:
            outcome = await missing(
                _NearBy(self._store),
                head,
                resident.head,
                budget=self._budget,
                hints=resident.head_generations,
                known=[known[i] for i in head if i in known],
            )
        except EventNotFound:
            return None
        if isinstance(outcome.relation, BudgetExceeded):
            return None
        return outcome.subject_only

    def _forget(self, entity_ids: Collection[EntityId]) -> None:
        """Evict entities whose rows are skipped, and what this node reported of them."""
        for entity_id in entity_ids:
            self._residents.evict(entity_id)
            self._reported.pop(entity_id, None)

    def _remember(self, entity_id: EntityId, head: Clock) -> None:
        reported = self._reported
        reported[entity_id] = head
        reported.move_to_end(entity_id)
        while len(reported) > REMEMBERED:
            reported.popitem(last=False)


def _one_step(
    shown: Clock, head: Clock, known: Mapping[EventId, AdmittedEvent]
) -> tuple[AdmittedEvent, ...] | None:
    """The events between ``shown`` and ``head`` without a walk, when ``head`` is one step
    on from ``shown``: every tip of ``head`` not in ``shown`` is known and has all its
    parents in ``shown``, and together with the tips both share they name every tip of
    ``shown`` (the commits of a moment: one event on the head this node showed). Else
    ``None``, and the walk decides."""
    new = [i for i in head if i not in shown]
    if not new or any(i not in known for i in new):
        return None
    reached = {i for i in head if i in shown}
    for event_id in new:
        parents = known[event_id].parent
        if any(p not in shown for p in parents):
            return None
        reached.update(parents)
    if len(reached) != len(shown):
        return None
    return tuple(sorted((known[i] for i in new), key=lambda e: (e.generation, e.id)))
