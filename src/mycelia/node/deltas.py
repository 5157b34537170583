"""What to send a peer about one entity, given the head it already has; and the rows of
a peer's query, within the query cost budget.

For each entity the responder answers a known head with nothing (same head), a bridge of
the missing events (when the entity strictly descends from the known head), or a state
snapshot — whichever is smaller (ARCHITECTURE.md §7). A bridge always carries every event
between the known head and the current one, parents first, so the receiver can apply it
without asking for more. A snapshot that strictly descends from the known head names it as
its ``base``, so a trusting receiver that still holds that head skips the walk between the
two (which would cost it the very events the snapshot saved sending). A bridge is sent
only while it has at most ``max_batch_events`` events (more could not be decoded in one
delta): past that, the snapshot.

The query cost budget (ARCHITECTURE.md §8): a peer's query costs its predicate's tests
(:func:`~mycelia.proto.query.syntax.cost`) per row it is evaluated on. More than
:data:`MAX_QUERY_TERMS` tests is refused at once; a query of more than
:data:`LIGHT_TERMS` is *heavy*: it runs one at a time per connection (its ``lane``), and
at most :data:`HEAVY_AT_ONCE` at a time on the node (the rest wait their turn, in order),
on the rows its light conjuncts select (through the engine's index); it is refused before
any evaluation when that would cost more than :data:`MAX_QUERY_WORK` tests; its
evaluation yields to the event loop every :data:`SLICE_SECONDS`. So however many
connections send heavy queries, the event loop spends at most ``HEAVY_AT_ONCE`` slices
on them between two rounds of everything else: handshakes, commits and cheap requests
are never held up behind them (:func:`served_rows`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Final

from mycelia.entity import DELETED
from mycelia.errors import EventNotFound, QueryTooExpensive
from mycelia.event_dag import BudgetExceeded, Relation, StrictDescends, compare
from mycelia.proto import AdmittedEvent, Clock, EntityState, Event, EventId
from mycelia.proto.limits import MAX_BATCH_EVENTS
from mycelia.proto.peering import Delta
from mycelia.proto.query import MATCH_ALL, And, IsNull, Query, sort_rows
from mycelia.proto.query.compile import compile_predicate
from mycelia.proto.query.syntax import Predicate, cost
from mycelia.retrieval import EventSource, LocalGetter, StagingMap, StoredState
from mycelia.storage import StorageEngine

__all__ = [
    "HEAVY_AT_ONCE",
    "LIGHT_TERMS",
    "MAX_QUERY_TERMS",
    "MAX_QUERY_WORK",
    "check_cost",
    "delta_for",
    "live_only",
    "query_rows",
    "served_rows",
]

BRIDGE_BUDGET = 100_000
"""Most events a bridge walk may read before it falls back to a snapshot."""
MIN_EVENT_BYTES: Final = 64
"""Fewer bytes than any event encodes to: a bridge of more events than a state's bytes over
this is larger than the state."""
MAX_QUERY_TERMS: Final = 256
"""Most tests a peer's query predicate may hold."""
LIGHT_TERMS: Final = 16
"""Queries of at most this many tests run as the engine runs them; more are heavy."""
MAX_QUERY_WORK: Final = 2_000_000
"""Most tests (rows × tests per row) one heavy query may evaluate."""
SLICE_SECONDS: Final = 0.002
"""How long a heavy query evaluates before it yields to the event loop."""
HEAVY_AT_ONCE: Final = 1
"""Heavy queries one node evaluates at once, over all its connections."""
_SLICE_TESTS: Final = 2048
"""Tests evaluated between two looks at the clock (a look costs about as much as one)."""


async def delta_for(
    storage: StorageEngine,
    state: EntityState,
    known: Collection[EventId] | None,
    *,
    matches: bool = True,
) -> Delta | None:
    """The delta bringing a peer that holds ``known`` (None: nothing) to ``state``.

    Returns None when the peer already has exactly this head and membership is unchanged.
    When ``state`` is what is stored and the peer's head is made of events stored here
    (:func:`_held_below`), the state descends from it with no walk, and the walk for a
    bridge stops once the bridge could no longer be smaller than the state.
    """
    head = state.state.head
    if known is not None and Clock(known) == head:
        return None if matches else Delta(state.entity_id, state.collection, False, None, ())
    if not known:
        return Delta(state.entity_id, state.collection, matches, state, ())
    base = Clock(known)
    room = state.wire_size()
    held = await _held_below(storage, state, base)
    proven = held is not None
    if held is not None and _fewest_between(state, base, held) * MIN_EVENT_BYTES >= room:
        return Delta(state.entity_id, state.collection, matches, state, (), base.ids)
    budget = min(BRIDGE_BUDGET, max(4, room // MIN_EVENT_BYTES)) if proven else BRIDGE_BUDGET
    relation, bridge = await _bridge(storage, head, base, budget, capped=proven)
    # (a walk that ends otherwise than over its budget has the last word)
    descends = bridge is not None or (proven and isinstance(relation, BudgetExceeded))
    if bridge is None or len(bridge) > MAX_BATCH_EVENTS:
        named = base.ids if descends else None
        return Delta(state.entity_id, state.collection, matches, state, (), named)
    for event in bridge:
        room -= len(event.to_bytes())
        if room <= 0:
            return Delta(state.entity_id, state.collection, matches, state, (), base.ids)
    return Delta(state.entity_id, state.collection, matches, None, tuple(bridge))


def _fewest_between(state: EntityState, known: Clock, known_generation: int) -> int:
    """The fewest events a bridge from ``known`` (its highest generation given) to
    ``state`` can hold, which strictly descends from it: each id of the head not in
    ``known`` (none of them is an ancestor of ``known``: it would not be maximal), and a
    chain from the highest generation of ``known`` to the head's."""
    head = state.state
    fresh = sum(1 for event_id in head.head.ids if event_id not in known)
    return max(fresh, max(head.generations) - known_generation)


async def _held_below(storage: StorageEngine, state: EntityState, known: Clock) -> int | None:
    """The highest generation in ``known`` if ``state`` provably strictly descends from
    it without a walk, else None: every id of ``known`` is an event of this entity stored
    here, and ``state`` is the state stored now, read after them.

    A durable engine stores an event only with a state whose history holds it, and an
    entity's history only grows, so every event stored is in the history of every state
    stored later. (With 200 writers on one entity, each peer's read walked back over
    every event since its last one: 30% of the server's time, O(writers²) in all.) The
    state is read again to be sure it is the one stored after those events: a commit
    in between makes it another (then the walk decides, as before)."""
    events = await storage.get_events(known.ids)
    entity_id = state.entity_id
    if len(events) != len(known) or any(e.entity_id != entity_id for e in events.values()):
        return None
    stored = await storage.get_state(entity_id)
    if stored is None or stored.state.head != state.state.head:
        return None
    return max(e.generation for e in events.values())


async def _bridge(
    storage: StorageEngine, head: Clock, known: Clock, budget: int, *, capped: bool = False
) -> tuple[Relation | None, list[Event] | None]:
    """How ``head`` relates to ``known`` (None: history is missing) and, if it strictly
    descends from it, the events between, parents first. The walk fetches at most about
    ``budget`` events (then the relation is ``BudgetExceeded``); ``capped``, it also reads
    at most ``budget`` ahead of what it fetches (read-ahead is not counted)."""
    getter: EventSource = LocalGetter(StagingMap(), storage)
    if capped:
        getter = _Capped(getter, budget)
    try:
        outcome = await compare(getter, head, known, budget=budget)
    except EventNotFound:
        return None, None
    if not isinstance(outcome.relation, StrictDescends):
        return outcome.relation, None
    return outcome.relation, [e.event for e in outcome.subject_only]


class _Capped:
    """An event source that reads at most ``left`` events ahead in all."""

    def __init__(self, source: EventSource, left: int) -> None:
        self._source, self._left = source, left

    async def get_events(
        self, ids: Collection[EventId], *, ahead: int = 0
    ) -> Mapping[EventId, AdmittedEvent]:
        found = await self._source.get_events(ids, ahead=min(ahead, self._left))
        self._left = max(0, self._left - len(found))
        return found


async def query_rows(storage: StorageEngine, collection: str, query: Query) -> list[StoredState]:
    """The stored states matching a bound query, in its order.

    Uses the engine's pushdown (``fetch``) when it has one, else scans the collection and
    runs the reference executor; both give the same list (the shared case file pins it).
    """
    query = live_only(query)
    fetch = getattr(storage, "fetch", None)
    if fetch is not None:
        result: list[StoredState] = await fetch(collection, query)
        return result
    everything = await storage.scan(collection)
    by_id = {s.state.entity_id: s for s in everything}
    ordered = sort_rows([(s.state.entity_id, s.values) for s in everything], query)
    return [by_id[entity_id] for entity_id, _ in ordered]


def live_only(query: Query) -> Query:
    """``query`` restricted to entities that are not deleted (every read path uses it)."""
    alive = IsNull((DELETED,))
    predicate = query.predicate
    combined = alive if predicate == MATCH_ALL.predicate else And((predicate, alive))
    return replace(query, predicate=combined)


def check_cost(query: Query) -> None:
    """Refuse a peer's query with more than :data:`MAX_QUERY_TERMS` tests.

    Raises:
        QueryTooExpensive: it has more.
    """
    terms = cost(query.predicate)
    if terms > MAX_QUERY_TERMS:
        raise QueryTooExpensive(
            f"the query holds {terms} tests; a peer's query may hold at most {MAX_QUERY_TERMS}"
        )


async def served_rows(
    storage: StorageEngine,
    collection: str,
    query: Query,
    *,
    lane: asyncio.Lock,
    heavy: asyncio.Semaphore,
) -> list[StoredState]:
    """The rows of a peer's bound query, as :func:`query_rows` gives them, within the
    query cost budget (see the module docstring; ``lane`` is the connection's, ``heavy``
    the node's: a semaphore of :data:`HEAVY_AT_ONCE`).

    Raises:
        QueryTooExpensive: too many tests, or too much work.
    """
    check_cost(query)
    if cost(query.predicate) <= LIGHT_TERMS:
        return await query_rows(storage, collection, query)
    async with lane, heavy:
        return await _heavy_rows(storage, collection, query)


async def _heavy_rows(storage: StorageEngine, collection: str, query: Query) -> list[StoredState]:
    light, heavy = _split(query.predicate)
    candidates = await query_rows(storage, collection, Query(light))
    work = len(candidates) * cost(heavy)
    if work > MAX_QUERY_WORK:
        raise QueryTooExpensive(
            f"the query would evaluate {work} tests over {len(candidates)} rows; a query may "
            f"evaluate at most {MAX_QUERY_WORK}: add an indexed condition (AND field = ...)"
        )
    matches = compile_predicate(heavy)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SLICE_SECONDS
    stride = max(1, _SLICE_TESTS // max(1, cost(heavy)))
    kept: dict[bytes, StoredState] = {}
    for i, row in enumerate(candidates):
        if matches(row.values):
            kept[row.state.entity_id] = row
        if i % stride == stride - 1 and loop.time() > deadline:
            await asyncio.sleep(0)  # let the loop serve others (handshakes first of all)
            deadline = loop.time() + SLICE_SECONDS
    ordered = sort_rows(
        [(s.state.entity_id, s.values) for s in kept.values()],
        replace(query, predicate=MATCH_ALL.predicate),
    )
    return [kept[entity_id] for entity_id, _ in ordered]


def _split(predicate: Predicate) -> tuple[Predicate, Predicate]:
    """``(light, heavy)``: the conjuncts cheap enough for the engine (its index may use
    them), and the rest; ``light AND heavy`` is ``predicate``."""
    items = predicate.items if isinstance(predicate, And) else (predicate,)
    light = [item for item in items if cost(item) <= LIGHT_TERMS]
    heavy = [item for item in items if cost(item) > LIGHT_TERMS]
    return _conjunction(light), _conjunction(heavy)


def _conjunction(items: list[Predicate]) -> Predicate:
    if not items:
        return MATCH_ALL.predicate
    return items[0] if len(items) == 1 else And(tuple(items))
