"""Joining a state that another process wrote meanwhile (ARCHITECTURE.md §6, several
processes on one store).

A writer plans an entity's new state on the head it holds in memory; when other processes
write the same store (PostgreSQL), one of them may have moved the stored head since. The
engine therefore reads the stored state **under the entity's row lock, in the write's own
transaction**, and asks :func:`join_stored` what to store, so that reading the head and
writing the state are one serialisable step per entity:

- the stored head is in the written state's history (the writer built on it, the common
  case, decided from the write's own events without a query): store the written state;
- otherwise (a concurrent write through another process, or a writer that was behind): the
  two states are **joined**: the events the written state has and the stored one lacks
  (found by the ``event_dag`` comparison, usually just the writer's new ones) are applied
  to the stored state, and the head becomes the maximal events of both heads. Every
  backend is a CRDT (ARCHITECTURE.md §5), so this is the state of the union of both
  histories: no head is lost and no stored event is left unreachable. A stored state
  that is ahead of the written one is kept as it is.

States whose buffers the entity layer cannot read (made by another version, or the
synthetic states of the conformance suite) cannot be joined: they are stored as written,
as every engine stores a state.

The comparison reads events through ``events``, which must see the write's own events
(the engine passes a reader on the write's transaction).
"""

from __future__ import annotations

from collections.abc import Mapping

from mycelia.entity import Action, Entity
from mycelia.entity.snapshots import drop_known_ancestors
from mycelia.entity.verdicts import action_for
from mycelia.errors import DecodeError, EventNotFound
from mycelia.event_dag import DEFAULT_BUDGET, compare
from mycelia.proto import AdmittedEvent, Clock, EntityState, EventId
from mycelia.retrieval import EventSource, StoredState

__all__ = ["covers", "join_stored"]


def covers(head: Clock, older: Clock, events: Mapping[EventId, AdmittedEvent]) -> bool:
    """Whether every id of ``older`` is in ``head`` or, by parent links among ``events``
    alone, an ancestor of it (sound, not complete: ``False`` means "not shown here")."""
    wanted = set(older) - set(head)
    frontier = list(head)
    seen: set[EventId] = set(frontier)
    while wanted and frontier:
        event = events.get(frontier.pop())
        if event is None:
            continue
        for parent in event.parent:
            if parent not in seen:
                seen.add(parent)
                wanted.discard(parent)
                frontier.append(parent)
    return not wanted


async def join_stored(
    stored: EntityState,
    written: StoredState,
    batch: Mapping[EventId, AdmittedEvent],
    events: EventSource,
    *,
    budget: int = DEFAULT_BUDGET,
) -> StoredState | None:
    """What to store for an entity whose stored state is ``stored`` when a writer writes
    ``written`` with the events ``batch``: ``None`` to store ``written`` as it is, or the
    joined state (see the module docstring)."""
    new = written.state
    assert isinstance(new, EntityState)
    if covers(new.state.head, stored.state.head, batch):
        return None
    hints = {**stored.state.head_generations(), **new.state.head_generations()}
    try:
        outcome = await compare(
            events, stored.state.head, new.state.head, budget=budget, hints=hints,
            known=batch.values(),
        )  # fmt: skip
        action = action_for(outcome.relation)
    except EventNotFound:  # a store holding snapshots without their events (a cache)
        action = Action.REJECT
    if action is Action.NOTHING:
        return None
    try:
        if action is Action.APPLY:  # the stored state plus what the writer added to it
            entity = Entity.from_state(stored)
            for event in outcome.other_only:
                entity.apply(event)
            entity.set_head(outcome.merged_head)
        else:  # undecidable here: join the buffers, keep both heads minus what is stale
            entity = Entity.from_state(new)
            entity.merge_state(stored)
            root = EventId(new.entity_id)
            entity.set_head(await drop_known_ancestors(hints, events, root=root, budget=budget))
    except DecodeError:
        return None  # not entity state this version can read: stored as written
    return StoredState(entity.to_state(), entity.snapshot().values)
