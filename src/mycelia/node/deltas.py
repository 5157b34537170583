"""What to send a peer about one entity, given the head it already has.

For each entity the responder answers a known head with nothing (same head), a bridge of
the missing events (when the entity strictly descends from the known head), or a state
snapshot — whichever is smaller (ARCHITECTURE.md §7). A bridge always carries every event
between the known head and the current one, parents first, so the receiver can apply it
without asking for more. A snapshot that strictly descends from the known head names it as
its ``base``, so a trusting receiver that still holds that head skips the walk between the
two (which would cost it the very events the snapshot saved sending).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from mycelia.entity import DELETED
from mycelia.errors import EventNotFound
from mycelia.event_dag import StrictDescends, compare
from mycelia.proto import Clock, EntityState, Event, EventId
from mycelia.proto.peering import Delta
from mycelia.proto.query import MATCH_ALL, And, IsNull, Query, sort_rows
from mycelia.retrieval import LocalGetter, StagingMap, StoredState
from mycelia.storage import StorageEngine

__all__ = ["delta_for", "live_only", "query_rows"]

BRIDGE_BUDGET = 100_000
"""Most events a bridge walk may read before it falls back to a snapshot."""


async def delta_for(
    storage: StorageEngine,
    state: EntityState,
    known: Collection[EventId] | None,
    *,
    matches: bool = True,
) -> Delta | None:
    """The delta bringing a peer that holds ``known`` (None: nothing) to ``state``.

    Returns None when the peer already has exactly this head and membership is unchanged.
    """
    head = state.state.head
    if known is not None and Clock(known) == head:
        return None if matches else Delta(state.entity_id, state.collection, False, None, ())
    if not known:
        return Delta(state.entity_id, state.collection, matches, state, ())
    base = Clock(known)
    bridge = await _bridge(storage, head, base)
    if bridge is None:
        return Delta(state.entity_id, state.collection, matches, state, ())
    room = len(state.to_bytes())
    for event in bridge:
        room -= len(event.to_bytes())
        if room <= 0:
            return Delta(state.entity_id, state.collection, matches, state, (), base.ids)
    return Delta(state.entity_id, state.collection, matches, None, tuple(bridge))


async def _bridge(storage: StorageEngine, head: Clock, known: Clock) -> list[Event] | None:
    """The events from ``known`` to ``head``, parents first, if ``head`` descends from it."""
    getter = LocalGetter(StagingMap(), storage)
    try:
        outcome = await compare(getter, head, known, budget=BRIDGE_BUDGET)
    except EventNotFound:
        return None
    if not isinstance(outcome.relation, StrictDescends):
        return None
    return [e.event for e in outcome.subject_only]


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
