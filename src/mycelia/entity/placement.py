"""Where an entity's new events go: which of them its head lacks, and the head after them
(ARCHITECTURE.md §4, §5). :class:`Placement` is the applier's (:mod:`mycelia.entity.applier`)
for events from anywhere but a local transaction.

Invariants:

- Placing never changes the entity: it returns the events to apply (parents first) and the
  head after them (``None``: the head just advances past them), and the applier applies.
- A walk happens only when nothing cheaper can decide: an entity's first events (its
  genesis among them), a live edit on the head, a durable sole writer's closed history,
  and a cache's events above its head or above every snapshot it merged are placed in
  O(their parents); otherwise a subject-side walk from the events to the head decides
  (the verdict table of :mod:`mycelia.entity.verdicts`), within the comparison budget.
- History is read through one getter per entity and run: staging, then storage (with
  events staged earlier in the run), then, on an ephemeral node, its durable peer.
"""

from __future__ import annotations

from collections.abc import Mapping

from mycelia.entity.entity import Entity
from mycelia.entity.runs import Overlay
from mycelia.entity.verdicts import (
    Action,
    above_boundary,
    above_head,
    action_for,
    extends_head,
    head_after,
    rejection,
)
from mycelia.errors import InvalidEvent
from mycelia.event_dag import missing
from mycelia.proto import AdmittedEvent, Clock, EntityId, EventId
from mycelia.retrieval import (
    CachedGetter,
    EntityStore,
    EventSource,
    LocalGetter,
    RemoteEvents,
    StagingMap,
    local_first,
)

__all__ = ["Placement"]


class Placement:
    """Places events against an entity's head (see the module docstring)."""

    def __init__(
        self,
        store: EntityStore,
        *,
        durable: bool,
        sole_writer: bool,
        remote: RemoteEvents | None,
        budget: int,
    ) -> None:
        self._store = store
        self._durable = durable
        self._sole_writer = sole_writer
        """Whether only this node writes ``store`` (False: other processes share it, so a
        resident may lag the store and an event may build on history it does not show)."""
        self._remote = remote
        """An ephemeral node's durable peer, asked for history it does not hold."""
        self._budget = budget

    async def place(
        self, entity: Entity, staged: list[AdmittedEvent], getter: LocalGetter
    ) -> tuple[list[AdmittedEvent], Mapping[EventId, int] | None]:
        """Which staged events the head lacks (parents first), and the head after them
        (``None``: the head just advances past them, :meth:`Entity.advance`)."""
        if not entity.exists:
            if not any(e.event.is_genesis for e in staged):
                raise InvalidEvent(
                    f"events for entity {entity.entity_id}, which does not exist here "
                    "(its genesis was never received)"
                )
            parents = {p for e in staged for p in e.parent}
            entity.history_closed = True
            return staged, {e.id: e.generation for e in staged if e.id not in parents}
        if extends_head(entity.head, staged):  # a live edit pushed to a subscriber
            return staged, None
        if self._sole_writer and self._durable and await self.history_closed(entity):
            # Where storage is definitive and every tip of the head is a stored event, an
            # event not stored yet descends from nothing stored and is an ancestor of no
            # tip (a tip's ancestors are stored: admission keeps history closed), and a tip
            # it descends from can only be one it names as a parent (else that parent would
            # be a stored descendant of a tip). So every staged event is new to the head,
            # and the head advances past them: no walk, O(their parents) — a wide head of
            # concurrent writers costs nothing per event (ARCHITECTURE.md §4). Not where
            # other processes write the store: a parent may be their event, stored but
            # not in this resident yet, whose effect only the walk brings in.
            return staged, None
        top = entity.top_generation
        if self._sole_writer and above_head(entity.head_map, top, staged):  # a cache's, mostly
            return staged, None
        cache = self._sole_writer and not self._durable
        if cache and above_boundary(entity.head_map, entity.boundary_top, staged):
            return staged, None
        return await self._walk(entity, staged, getter)

    async def _walk(
        self, entity: Entity, staged: list[AdmittedEvent], getter: LocalGetter
    ) -> tuple[list[AdmittedEvent], Mapping[EventId, int] | None]:
        """:meth:`place` by a subject-side walk: the events the head lacks, without walking
        the head's own branches (admission already keeps foreign lineage out: parents are
        this entity's); the verdict table decides."""
        tips, head, hints = Clock(e.id for e in staged), entity.head, entity.head_generations
        outcome = await local_first(
            getter,
            lambda events: missing(
                events, tips, head, budget=self._budget, hints=hints, known=staged
            ),
        )
        action = action_for(outcome.relation)
        if action is Action.NOTHING:
            return [], entity.head_generations
        if action is Action.REJECT:
            raise rejection(outcome.relation, entity.entity_id)
        applied = list(outcome.subject_only)
        return applied, head_after(entity.head_generations, applied)

    async def history_closed(self, entity: Entity) -> bool:
        """Whether every tip of the entity's head is a stored event (looked up once per
        resident; a snapshot merged without its history may leave tips it lacks)."""
        closed = entity.history_closed
        if closed is None:
            tips = entity.head.ids
            closed = entity.history_closed = len(await self._store.get_events(tips)) == len(tips)
        return closed

    def getter(
        self,
        entity_id: EntityId,
        staging: StagingMap,
        earlier: Mapping[EventId, AdmittedEvent] | None = None,
    ) -> LocalGetter:
        """Staging and storage (with events staged earlier in this run, not stored yet),
        then (on an ephemeral node with a peer) the peer."""
        store: EventSource = self._store if not earlier else Overlay(earlier, self._store)
        if self._remote is None:
            return LocalGetter(staging, store)
        return CachedGetter(staging, store, self._remote, entity_id=entity_id)
