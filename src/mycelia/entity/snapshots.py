"""What a state snapshot does to an entity (ARCHITECTURE.md §7: a snapshot, not events).

- :func:`merged_head` decides a snapshot's head against the entity's by comparison (the
  verdict table of :mod:`mycelia.entity.verdicts`);
- :func:`adopted`, :func:`merged` and :func:`replaced` are the applier's plans for a
  snapshot of an entity it lacks, one it merges, and one that replaces its own. On a
  cache, each remembers the snapshot's tips as known history (``Entity.boundary``): the
  events below a snapshot are never stored there, and other writers' concurrent events
  name those tips long after the head moved on (before, each such event was held and its
  parent fetched: half of all pushes with 200 clients editing at once).

When a snapshot from a peer must be merged and the history needed to compare the two
heads is not available (ARCHITECTURE.md §7: the peer went away mid-walk, say), the
applier keeps both heads. Keeping an id that is an ancestor of another would break the
antichain invariant every later placement relies on (a new event names only the tips it
was made on as parents), so this module drops every id the history held *here* shows to
be an ancestor of another. History not held here proves nothing: what remains may still
be wider than the true head, never narrower, and a later comparison settles it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Final

from mycelia.entity.entity import Entity, Snapshot, plain_values
from mycelia.entity.runs import Adopted, Plan, differing, fetched
from mycelia.entity.verdicts import Action, action_for, head_after, rejection
from mycelia.errors import BudgetExceeded, EventNotFound, InvalidEvent
from mycelia.event_dag import compare
from mycelia.proto import EMPTY_CLOCK, AdmittedEvent, Clock, EntityId, EntityState, EventId
from mycelia.retrieval import EventSource, LocalGetter, local_first

log = logging.getLogger(__name__)

__all__ = [
    "absent",
    "adopted",
    "drop_known_ancestors",
    "merged",
    "merged_head",
    "merged_plan",
    "replaced",
]


def adopted(incoming: EntityState, *, cache: bool) -> Plan:
    """The plan for a snapshot of an entity this node does not have (or has only empty).
    A cache takes its durable peer's state as it came (it trusts that peer's states: an
    honest one encodes them canonically), so it stores it without encoding it again; a
    durable node encodes it canonically (it serves what it stores). A cache adopts a state
    of LWW values only as an :class:`Adopted`, decoding its values and nothing else."""
    before = absent(incoming.entity_id, incoming.collection)
    if cache and incoming.state.head:
        values = plain_values(incoming.state)
        if values is not None:
            return Plan(Adopted(incoming, values), before, [], [], set(values), snapshot=True)
    fresh = _materialised(incoming, cache=cache)
    # Through the snapshot, which the write and the resident's size estimate read again.
    return Plan(fresh, before, [], [], set(fresh.snapshot().values), snapshot=True)


def _materialised(incoming: EntityState, *, cache: bool) -> Entity:
    """The entity of a state adopted whole (see :func:`adopted`); on a cache, its tips
    are a snapshot's (see the module docstring)."""
    fresh = Entity.from_state(incoming, canonical=cache)
    if cache:
        fresh.mark_boundary(fresh.head_map)
    return fresh


def absent(entity_id: EntityId, collection: str) -> Snapshot:
    """The snapshot of an entity not created yet (what ``Entity.empty(...).snapshot()``
    gives, without the entity: a fresh client adopts a thousand at once)."""
    return Snapshot(entity_id, collection, EMPTY_CLOCK, _NO_VALUES)


_NO_VALUES: Final[Mapping[str, object]] = MappingProxyType({})


def merged(
    entity: Entity,
    incoming: EntityState,
    head: Mapping[EventId, int],
    *,
    cache: bool,
    staged: Sequence[AdmittedEvent] = (),
) -> Plan:
    """The plan that merges ``incoming``'s values into ``entity`` and sets its ``head``
    (decided by the caller); ``staged`` are events fetched on the way, to store."""
    before = entity.snapshot()
    changed = entity.merge_state(incoming)
    entity.set_head(head)
    entity.history_closed = None  # the snapshot's tips may not be stored here
    if cache:
        entity.mark_boundary(incoming.state.head_generations())
    return Plan(entity, before, list(staged), [], changed, snapshot=True)


def replaced(
    entity_id: EntityId,
    state: EntityState | None,
    current: Entity | None,
    replay: Sequence[AdmittedEvent],
    *,
    cache: bool,
) -> Plan | None:
    """The plan that replaces ``current`` with a durable peer's ``state`` (``None``: the
    peer has none) and applies ``replay``, this node's own events on it, on top;
    ``None`` when there is nothing to replace."""
    if state is not None:
        entity = _materialised(state, cache=cache)
    elif current is not None:
        entity = Entity.empty(entity_id, current.collection)
    else:
        return None
    before = absent(entity_id, entity.collection) if current is None else current.snapshot()
    mine = [e for e in replay if e.entity_id == entity_id]
    for event in mine:
        entity.apply(event)
    if mine:
        entity.set_head(head_after(entity.head_generations, mine))
    return Plan(entity, before, mine, mine, differing(before, entity), snapshot=True)


async def drop_known_ancestors(
    head: Mapping[EventId, int],
    events: EventSource,
    *,
    root: EventId,
    budget: int,
    complete: bool = False,
) -> dict[EventId, int]:
    """``head`` (id → generation) without the ids that held events show are ancestors of
    others in it, nor the entity's genesis ``root`` beside any other id (every event of an
    entity descends from its genesis); walks at most ``budget`` events, never below the
    head's lowest generation (nothing there can be in it). ``complete``: raises
    EventNotFound for an event the walk needs that ``events`` does not hold, and
    BudgetExceeded when the budget ends the walk before the floor, rather than keeping
    what it cannot decide."""
    if len(head) < 2:
        return dict(head)
    if root in head:
        head = {i: g for i, g in head.items() if i != root}
        if len(head) < 2:
            return head
    floor = min(head.values())
    stale: set[EventId] = set()
    seen: set[EventId] = set(head)
    frontier = sorted(head)
    walked = 0
    while frontier and walked < budget:
        found = await events.get_events(frontier)
        if complete:
            _require(frontier, found)
        walked += len(found)
        step: list[EventId] = []
        for event in found.values():
            for parent in event.parent:
                if parent in head:
                    stale.add(parent)
                if parent not in seen:
                    seen.add(parent)
                    step.append(parent)
        held = await events.get_events(step) if step else {}
        if complete:
            _require(step, held)
        frontier = sorted(i for i in step if i in held and held[i].generation >= floor)
    if complete and frontier:
        raise BudgetExceeded(
            f"telling which of {len(head)} tips descend from others walked {walked} events "
            f"(the budget) before reaching generation {floor}"
        )
    return {i: g for i, g in head.items() if i not in stale}


def _require(ids: Iterable[EventId], found: Mapping[EventId, AdmittedEvent]) -> None:
    for event_id in ids:
        if event_id not in found:
            raise EventNotFound(f"event {event_id} is not held here", event_id=event_id)


async def merged_plan(
    entity: Entity | None,
    incoming: EntityState,
    base: Clock | None,
    getter: Callable[[], LocalGetter],
    events: EventSource,
    *,
    budget: int,
    fetching: bool,
    cache: bool,
) -> Plan | None:
    """The plan that merges the snapshot ``incoming`` into ``entity`` (``None``: not held
    here; the plan's ``None``: it adds nothing). ``base`` is a head the snapshot strictly
    descends from on a trusted peer's word: while the entity has exactly that head, the
    snapshot's head is taken without a comparison; otherwise :func:`merged_head` decides,
    through ``getter()``. Raises InvalidEvent for another collection, and what
    :func:`merged_head` raises."""
    if entity is not None and incoming.collection != entity.collection:
        raise InvalidEvent(
            f"snapshot of {incoming.entity_id} names collection {incoming.collection!r}, "
            f"not {entity.collection!r}"
        )
    if entity is None or not entity.exists:
        return adopted(incoming, cache=cache)
    if base is not None and entity.head == base:
        return merged(entity, incoming, incoming.state.head_generations(), cache=cache)
    history = getter()
    head = await merged_head(entity, incoming, history, events, budget=budget, fetching=fetching)
    if head is None:
        return None
    return merged(entity, incoming, head, cache=cache, staged=fetched(history))


async def merged_head(
    entity: Entity,
    incoming: EntityState,
    getter: LocalGetter,
    events: EventSource,
    *,
    budget: int,
    fetching: bool,
) -> dict[EventId, int] | None:
    """The entity's head after merging ``incoming`` (``None``: it adds nothing).

    Raises what the verdict table refuses (a foreign lineage). Where the history needed to
    decide cannot be had: raises EventNotFound when ``fetching`` (the durable peer holds
    it: merge once it can be asked), else keeps both heads, less what ``events`` proves
    stale (:func:`drop_known_ancestors`).
    """
    hints = {**entity.head_generations, **incoming.state.head_generations()}
    try:
        outcome = await local_first(
            getter,
            lambda events: compare(
                events, incoming.state.head, entity.head, budget=budget, hints=hints
            ),
        )
    except EventNotFound:
        if fetching:
            raise
        log.info(
            "merging a snapshot of %s without its history: keeping both heads", entity.entity_id
        )
        root = EventId(entity.entity_id)
        return await drop_known_ancestors(hints, events, root=root, budget=budget)
    action = action_for(outcome.relation)
    if action is Action.NOTHING:
        return None
    if action is Action.REJECT:
        raise rejection(outcome.relation, entity.entity_id)
    return dict(outcome.merged_head)
