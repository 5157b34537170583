"""What a served query sends: its first answer and its updates (ARCHITECTURE.md §7, §8).

A :class:`ServedQuery` is one peer's query as this node answers it: a subscription, or a
one-off fetch. :class:`ServedQueries` computes its deltas: :meth:`ServedQueries.answer`
for the first answer, and :meth:`ServedQueries.update` for each batch of changes
committed here. The responder (:mod:`mycelia.node.serving`) keeps which peer holds which
query, feeds the batches in order, and pages what these return.

Invariants:

- ``standing.sent`` is what the peer holds fresh for the query, with the head it holds:
  a member's delta is noted there before it is returned, and a non-member is dropped from
  it. An update sends a change's own events when the peer holds the head before it and
  they are small; otherwise a snapshot or a bridge.
- An answer holds about :data:`READ_BYTES` of its result's rows. A light query without
  LIMIT is read a page at a time (keyset paging: the peer orders its result itself), in
  the order of the field its index plan reads, or by id without one, so that each page
  costs about its own rows; its first page is sent before the rest is read. Any other
  query is ranked first, keeping its first rows whole and only the ids and heads of the
  rest: it reads those again from storage a batch of about ``READ_BYTES`` at a time as it
  yields them; a row changed since it was ranked is sent only if it still belongs to the
  result. A change committed after its row was read is fed to the subscription once the
  answer is built.
- Every row sent passes the policy's ``can_read`` for the standing's credentials. An
  entity the peer may not read gets the same delta as one that does not exist:
  ``matches=False``, with no data.
- A LIMIT result is placed from ``standing.ranks`` while every change can be placed
  there (:mod:`mycelia.node.ranks`); otherwise storage ranks it again. A match outside
  the LIMIT is not sent; rows that enter it to refill it are.
- The peer's own commit on the head it holds (an echo, :class:`Own`) is not sent back:
  the peer holds the head after it already. One merged with events it may lack (another
  writer's, concurrent) is sent even where the query holds nothing for the peer: the peer
  shows its own version wherever that matches, and the merge may have moved it out.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Final, NamedTuple, Protocol

from mycelia.entity import Entity, EntityChange, Snapshot
from mycelia.node.budget import ANSWER_PAGE_BYTES
from mycelia.node.deltas import (
    HEAVY_AT_ONCE,
    LIGHT_TERMS,
    delta_for,
    live_only,
    query_rows,
    served_rows,
)
from mycelia.node.policy import Credentials, PolicyAgent
from mycelia.node.pushes import events_size
from mycelia.node.ranks import Ranks
from mycelia.proto import Clock, EntityId, EntityState
from mycelia.proto.limits import MAX_BATCH_EVENTS
from mycelia.proto.peering import Delta, KnownEntity
from mycelia.proto.query import After, OrderKey, Query, evaluate, order_key
from mycelia.proto.query.compile import Compiled, compile_predicate
from mycelia.proto.query.syntax import cost
from mycelia.retrieval import StoredState
from mycelia.storage import StorageEngine
from mycelia.storage.plan import plan_query

__all__ = ["PAGE_LIMIT", "Loader", "Own", "ServedQueries", "ServedQuery"]

PAGE_LIMIT: Final = 1024 * 1024
"""Most bytes of events a pushed update sends as they are (more: a snapshot or bridge)."""
READ_BYTES: Final = ANSWER_PAGE_BYTES
"""About how many bytes of states an answer reads from storage at once (after its first
read): about one of its pages, so a page goes out while the next is read."""
_FIRST_READ: Final = 1
"""How many rows an answer's first read takes: one, whose bytes size the next read. (Rows
may be as large as an entity, 4 MiB less 64 KiB: a first read of 16 held a fresh
subscriber's 16 largest rows at once, 8 subscribers of 12 such rows 1.4 GB.)"""
_RAMP: Final = 64
"""Rows a read may take whatever the last one took (bytes permitting): small rows reach
about a page at the second read."""
_SHARED_QUERIES: Final = 256
"""Most LIMIT queries whose ranking is kept for the next subscription to ask (see
:class:`_SharedRankings`)."""


@dataclass(slots=True)
class ServedQuery:
    """One peer's query as this node answers it (a subscription, or a one-off fetch)."""

    query_id: int
    collection: str
    query: Query
    credentials: Credentials
    sent: dict[EntityId, Clock] = field(default_factory=dict)
    """Entities the peer holds for this query, with the head it holds."""
    predicate: Compiled | None = None
    """The query's predicate, compiled once (see :mod:`mycelia.proto.query.compile`)."""
    ranks: Ranks | None = None
    """A LIMIT query's result as last ranked (``None``: rank it from storage next)."""


class Own(NamedTuple):
    """How a change holds the subscriber's own commit (see the module docstring)."""

    echo: bool
    """It is made only of the peer's events: on the head the peer holds, it holds the head
    after too."""
    behind: bool
    """Its head holds events the peer may lack (another writer's, merged with its own)."""


class Loader(Protocol):
    """How the served queries read an entity as this node holds it (the applier)."""

    async def settled(self, entity_id: EntityId) -> Entity | None:
        """The entity as durably written, once no write is in flight on it (``None`` if
        unknown): a peer is never sent a change this node could still lose."""
        ...


class ServedQueries:
    """The deltas of served queries (see the module docstring)."""

    def __init__(self, entities: Loader, storage: StorageEngine, policy: PolicyAgent) -> None:
        self._entities = entities
        self._storage = storage
        self._policy = policy
        self._heavy = asyncio.Semaphore(HEAVY_AT_ONCE)
        """The node's heavy queries being evaluated (ARCHITECTURE.md §8)."""
        self._shared = _SharedRankings(storage)

    async def answer(
        self, standing: ServedQuery, known: tuple[KnownEntity, ...], *, lane: asyncio.Lock
    ) -> AsyncIterator[Delta]:
        """Deltas for ``standing``'s query, and (into ``standing.sent``) what the peer then
        holds fresh for it: the result, plus known entities that still match the predicate
        (outside a LIMIT they are kept fresh, so the peer's own ordering stays right). A
        known entity the peer may not read, of another collection, or unknown here gets
        the same delta: ``matches=False`` with no data. A LIMIT result is kept as
        ``standing.ranks`` (see :meth:`_rank`). ``lane`` is the peer's lane for heavy queries
        (one at a time per connection).
        """
        credentials, collection, query = standing.credentials, standing.collection, standing.query
        members = standing.sent
        known_heads = {k.entity_id: k.head for k in known}
        if standing.query.limit is None and cost(query.predicate) <= LIGHT_TERMS:
            rows = self._stream(standing)
        else:
            rows = self._read(standing, await self._rank(standing, lane))
        async for state in rows:
            held = known_heads.pop(state.entity_id, None)
            if held is None:  # (a fresh peer's every row: the state as it is, no call)
                yield Delta(state.entity_id, state.collection, True, state, ())
            else:
                delta = await delta_for(self._storage, state, held)
                if delta is not None:
                    yield delta
            members[state.entity_id] = state.state.head
        for entity_id, head in known_heads.items():
            entity = await self._entities.settled(entity_id)
            snapshot = None if entity is None or not entity.exists else entity.snapshot()
            if (
                entity is None
                or snapshot is None
                or entity.collection != collection
                or not self._policy.can_read(credentials, snapshot)
            ):
                yield Delta(entity_id, collection, False, None, ())  # absent, to this peer
                continue
            matches = not snapshot.deleted and evaluate(query.predicate, snapshot.values)
            delta = await delta_for(self._storage, entity.to_state(), head, matches=matches)
            if delta is not None:
                yield delta
            if matches:
                members[entity_id] = snapshot.head

    async def update(
        self,
        standing: ServedQuery,
        changes: list[EntityChange],
        own: Mapping[int, Own],
        *,
        lane: asyncio.Lock,
    ) -> list[Delta]:
        """The deltas a batch of changes means for one standing query.

        The peer holds ``standing.sent`` fresh while they match the predicate; a new match
        is pushed if it belongs to the result (with a LIMIT, only if it ranks inside it:
        then members that left the LIMIT stay fresh on the peer, and rows that entered to
        refill it are pushed). ``own`` maps the ``id`` of each change that holds the peer's
        own commit to how it does (see the module docstring).
        """
        relevant = [c for c in changes if c.after.collection == standing.collection]
        if not relevant:
            return []
        ranked: set[EntityId] | None = None
        if standing.query.limit is not None:
            ranked = self._placed(standing, relevant)
            if ranked is None:
                ranked = (await self._rank(standing, lane)).ids()
        deltas = []
        for change in relevant:
            entity_id = change.after.entity_id
            member = self._member(standing, change.after)
            if entity_id not in standing.sent and ranked is not None and entity_id not in ranked:
                member = False  # a match outside the LIMIT: nothing the peer needs yet
            delta = await self._delta_for_change(
                standing, change, member=member, own=own.get(id(change))
            )
            if delta is not None:
                deltas.append(delta)
        if ranked is not None:
            deltas.extend(await self._refill(standing, ranked))
        return deltas

    def _placed(self, standing: ServedQuery, changes: list[EntityChange]) -> set[EntityId] | None:
        """A LIMIT query's result after ``changes``, placed from its ranks (``None``: only
        storage can rank them; see :mod:`mycelia.node.ranks`)."""
        ranks, standing.ranks = standing.ranks, None  # back once every change is placed
        if ranks is None:
            return None
        order_by = standing.query.order_by
        for change in changes:
            after = change.after
            selected = not after.deleted and self._selects(standing, after)
            if selected and not self._policy.can_read(standing.credentials, after):
                return None  # storage ranks a row policy hides among the LIMIT
            key = order_key(after.values, order_by) if selected else None
            if ranks.place(after.entity_id, key) is None:
                return None
        standing.ranks = ranks
        return set(ranks.members())

    async def _rank(self, standing: ServedQuery, lane: asyncio.Lock) -> _Ranked:
        """The query's result the peer may read, in its order, from storage: its first rows
        whole, about :data:`READ_BYTES` of them, then the ids and heads of the rest (their
        rows are let go at once: :meth:`_read` reads them again as they are sent). A LIMIT
        result is kept as ``standing.ranks`` when policy hides none of its rows (a hidden
        row among them: every change is ranked by storage)."""
        collection, query = standing.collection, standing.query
        if isinstance(query.limit, int) and cost(query.predicate) <= LIGHT_TERMS:
            rows = await self._shared.rows(collection, query)
        else:
            rows = await served_rows(self._storage, collection, query, lane=lane, heavy=self._heavy)
        can_read, credentials = self._policy.can_read, standing.credentials
        ranked, room, readable = _Ranked(), READ_BYTES, 0
        for s in rows:
            state = s.state
            if not can_read(credentials, _snapshot(state, s.values)):
                continue
            readable += 1
            if room > 0:
                ranked.first.append(state)
                room -= state.wire_size(estimate=True)
            else:
                ranked.rest.append((state.entity_id, state.state.head))
        limit = standing.query.limit
        if isinstance(limit, int) and readable == len(rows):
            order_by = standing.query.order_by
            standing.ranks = Ranks(
                limit, [(s.state.entity_id, order_key(s.values, order_by)) for s in rows]
            )
        return ranked

    async def _stream(self, standing: ServedQuery) -> AsyncIterator[EntityState]:
        """The result of a light query without LIMIT, read from storage a page at a time
        (keyset paging, ``fetch(..., after=...)``, in :func:`_paging_order`): the first
        page is on the wire before the rest is read, and an answer holds about one page
        however large its result is, and however large its rows. The first read takes
        :data:`_FIRST_READ` row, each next one about twice as many (at least
        :data:`_RAMP`), up to about :data:`READ_BYTES`. Rows the peer may not
        read are skipped; a row committed to after its page was read reaches the
        subscription after the answer (see :mod:`mycelia.node.serving`)."""
        collection, credentials = standing.collection, standing.credentials
        query, can_read = _paging_order(live_only(standing.query)), self._policy.can_read
        after, count = None, _FIRST_READ
        while True:
            page = await self._storage.fetch(collection, replace(query, limit=count), after=after)
            size = 0
            for row in page:
                state = row.state
                size += state.wire_size(estimate=True)
                if can_read(credentials, _snapshot(state, row.values)):
                    yield state
            if len(page) < count:
                return
            last = page[-1]
            after = After.row(query, last.state.entity_id, last.values)
            del page, last
            count = _next_read(count, size)

    async def _read(self, standing: ServedQuery, ranked: _Ranked) -> AsyncIterator[EntityState]:
        """The states of the ``ranked`` result: its first rows as ranked, then the rest read
        from storage a batch of about :data:`READ_BYTES` at a time, so an answer holds
        about one page of its result however large it is. A row changed since it was ranked
        is loaded again and yielded only while the peer may read it and it matches: the
        change itself reaches the peer's subscriptions after the answer (see
        :mod:`mycelia.node.serving`)."""
        first, rows = ranked.first[::-1], ranked.rest
        del ranked  # (a suspended generator holds its locals: the rows go as they are sent)
        while first:
            yield first.pop()
        start, count = 0, _FIRST_READ
        while start < len(rows):
            batch = rows[start : start + count]
            start += len(batch)
            states = await self._storage.get_states([entity_id for entity_id, _ in batch])
            size = 0
            for entity_id, head in batch:
                state = states.get(entity_id)
                if state is not None and state.state.head != head:
                    state = await self._current(standing, entity_id)
                if state is not None:
                    size += state.wire_size(estimate=True)
                    yield state
            del states, state
            count = _next_read(count, size)

    async def _current(self, standing: ServedQuery, entity_id: EntityId) -> EntityState | None:
        """The entity's state as this node holds it, if it belongs to the query's result."""
        entity = await self._entities.settled(entity_id)
        if entity is None or not entity.exists:
            return None
        return entity.to_state() if self._member(standing, entity.snapshot()) else None

    async def _refill(self, standing: ServedQuery, ranked: set[EntityId]) -> list[Delta]:
        """Rows that entered a LIMIT result because others left it."""
        deltas = []
        for entity_id in ranked - set(standing.sent):
            state = await self._storage.get_state(entity_id)
            if state is None:
                continue
            delta = await delta_for(self._storage, state, None)
            if delta is not None:
                deltas.append(delta)
            standing.sent[entity_id] = state.state.head
        return deltas

    async def _delta_for_change(
        self, standing: ServedQuery, change: EntityChange, *, member: bool, own: Own | None
    ) -> Delta | None:
        entity_id = change.after.entity_id
        held = standing.sent.get(entity_id)
        if not member and held is None and not (own and own.behind):
            return None
        if own and own.echo and member and (held or Clock()) == change.before.head:
            # The peer's own commit on the head it holds (or its own create): it holds the
            # head after it too (its events, on what it held), and it shows the entity. A
            # create is said to match, with no data: the peer learns that this query keeps
            # it current (mycelia.node.kept).
            standing.sent[entity_id] = change.after.head
            return (
                None if held is not None else Delta(entity_id, standing.collection, True, None, ())
            )
        delta: Delta | None
        if not member and not self._policy.can_read(standing.credentials, change.after):
            delta = Delta(entity_id, standing.collection, False, None, ())  # no data: not theirs
        elif held is not None and held == change.before.head and _small(change):
            events = tuple(e.event for e in change.events)
            delta = Delta(entity_id, standing.collection, member, None, events)
        else:
            state = await self._storage.get_state(entity_id)
            if state is None:
                return None
            delta = await delta_for(self._storage, state, held, matches=member)
        if member:
            standing.sent[entity_id] = change.after.head
        else:
            standing.sent.pop(entity_id, None)
        return delta

    def _member(self, standing: ServedQuery, snapshot: Snapshot) -> bool:
        return (
            not snapshot.deleted
            and self._selects(standing, snapshot)
            and self._policy.can_read(standing.credentials, snapshot)
        )

    @staticmethod
    def _selects(standing: ServedQuery, snapshot: Snapshot) -> bool:
        """Whether the query's predicate selects the entity's values (policy aside)."""
        return (standing.predicate or compile_predicate(standing.query.predicate))(snapshot.values)


class _SharedRankings:
    """The rows of light LIMIT queries as storage ranks them, each ranking shared by every
    subscription that asks for it while storage holds no newer commit (its last offset):
    a change that makes room in the LIMIT of a hundred subscribers' identical query ranks
    it once, not a hundred times, and a ranking can read the whole collection (ORDER BY a
    field the predicate does not restrict). A ranking is read after the offset is, so it
    holds at least what the offset says; one in flight is shared too. Kept until the next
    commit, when its rows are no more than an answer's page: a few hundred small rankings."""

    __slots__ = ("_at", "_rankings", "_storage")

    def __init__(self, storage: StorageEngine) -> None:
        self._storage = storage
        self._at = -1
        self._rankings: dict[tuple[str, Query], asyncio.Task[list[StoredState]]] = {}

    async def rows(self, collection: str, query: Query) -> list[StoredState]:
        """The stored rows of ``query`` (light, with a LIMIT), in its order."""
        at = await self._storage.last_offset()
        if at != self._at:
            self._at, self._rankings = at, {}
        key, rankings = (collection, query), self._rankings
        task = rankings.get(key)
        if task is None:
            task = asyncio.ensure_future(query_rows(self._storage, collection, query))
            task.add_done_callback(lambda done: _let_go(rankings, key, done))
            if len(rankings) < _SHARED_QUERIES:
                rankings[key] = task
        return await asyncio.shield(task)  # (one asker cancelled cancels no other)


def _let_go(
    rankings: dict[tuple[str, Query], asyncio.Task[list[StoredState]]],
    key: tuple[str, Query],
    done: asyncio.Task[list[StoredState]],
) -> None:
    """Forget a ranking that failed or is larger than a page once it is read (its askers
    have it), and mark a failure seen (every asker may have been cancelled)."""
    if done.cancelled() or done.exception() is not None:
        kept = False
    else:
        kept = sum(s.state.wire_size(estimate=True) for s in done.result()) <= READ_BYTES
    if not kept and rankings.get(key) is done:
        del rankings[key]


@dataclass(slots=True)
class _Ranked:
    """A query's result as ranked (:meth:`ServedQueries._rank`): its first rows whole,
    then the ids and heads of the rest."""

    first: list[EntityState] = field(default_factory=list)
    rest: list[tuple[EntityId, Clock]] = field(default_factory=list)

    def ids(self) -> set[EntityId]:
        """The result's ids."""
        return {s.entity_id for s in self.first} | {entity_id for entity_id, _ in self.rest}


def _paging_order(query: Query) -> Query:
    """The order an answer of ``query`` is read in a page at a time (the peer orders its
    result itself): by the field its index plan reads when it has one, so each page walks
    the index from where the last one stopped, else by id. (By id, a plan's every page
    would read and sort all its candidates: 40,000 rows took 7.4 s instead of 0.6.)"""
    plan = plan_query(replace(query, order_by=(), limit=1))
    if plan is None or not plan.ranges:
        return replace(query, order_by=())
    return replace(query, order_by=(OrderKey((plan.field,)),))


def _next_read(count: int, size: int) -> int:
    """How many rows the next read takes after one of ``count`` rows and ``size`` bytes:
    twice as many (at least :data:`_RAMP`), up to about :data:`READ_BYTES`."""
    return max(1, min(max(2 * count, _RAMP), count * READ_BYTES // max(size, 1)))


def _small(change: EntityChange) -> bool:
    """Whether a change's events can travel as they are (else a snapshot or bridge)."""
    return len(change.events) <= MAX_BATCH_EVENTS and events_size(change.events) <= PAGE_LIMIT


def _snapshot(state: EntityState, values: Mapping[str, object]) -> Snapshot:
    return Snapshot(state.entity_id, state.collection, state.state.head, values)
