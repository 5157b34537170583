"""What a dump's entity must prove before it loads (ARCHITECTURE.md §6, "load trusts
nothing"), and how it joins the entity already in the store.

Invariants of :class:`EntityCheck` (one entity's records, in file order):

- Every event belongs to the entity, comes **parents first** and at most once; its
  generation is recomputed from its parents. A genesis binds the dump's system root
  (``check_genesis``). An event whose parents the dump does not hold is refused, except
  in an ephemeral dump (a cache's events on top of a snapshot), where its generation is
  the file's.
- Where the entity's history is **closed** in the dump (its genesis and every parent are
  there), its state is **recomputed** by replaying the events through the entity layer
  (``Entity.apply``); the dumped state must have the same head, the same values, the same
  queryable values and byte-identical buffers for every backend whose buffer is canonical
  (all but text, whose content is compared), and the *recomputed* state is what loads.
  So a forged value, a forged LWW writer and an older or newer state than the events all
  fail with :class:`~mycelia.errors.InvalidState`.
- A state without that history (a snapshot) loads only from an ephemeral dump into a
  store that is not durable (``durable=False``): there is no signature on a state to
  check it against (states carry none), and a durable store must never hold a head
  naming events it lacks (ARCHITECTURE.md §1.2). Its queryable values are recomputed
  from its buffers.

:func:`merge_with_stored` then never moves a state backwards: a loaded state is joined
with the stored one by the backends' state merge (every backend is a state CRDT) and the
head becomes the maximal events of both, by the comparison of :mod:`mycelia.event_dag`; a
loaded state the stored one already descends from writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from mycelia.entity import Entity
from mycelia.entity.admission import check_genesis
from mycelia.entity.backends import TextBackend
from mycelia.entity.verdicts import Action, action_for, rejection
from mycelia.errors import (
    DecodeError,
    EventNotFound,
    ForeignSystem,
    InvalidEvent,
    InvalidState,
    SystemNotReady,
)
from mycelia.event_dag import compare
from mycelia.proto import AdmittedEvent, EntityId, Event, EventId
from mycelia.retrieval import LocalGetter, StagingMap, StoredState
from mycelia.storage.engine import StorageEngine, encode_values

__all__ = ["EntityCheck", "Rules", "merge_with_stored"]


@dataclass(frozen=True, slots=True)
class Rules:
    """What the dump and the target allow."""

    root: EntityId | None
    """The dump's system root (its ``system_root`` record)."""
    ephemeral_dump: bool
    """The dump's kind says it is a cache's (snapshots and open histories allowed)."""
    durable_target: bool
    """The store loaded into is a durable node's (no state without its history)."""


class EntityCheck:
    """One entity of a dump, checked record by record (see the module docstring)."""

    def __init__(self, entity_id: EntityId, rules: Rules) -> None:
        self.entity_id = entity_id
        self.rules = rules
        self.staging = StagingMap()
        """The entity's events from the dump, with recomputed generations."""
        self.replay: Entity | None = None
        """The entity its events give, while its history is closed (else None)."""
        self.closed = True
        self.collection: str | None = None
        """The collection of the entity's first event."""
        self.dumped: StoredState | None = None

    def add(self, claimed: int, event: Event) -> AdmittedEvent:
        """Check one event (with the generation the file gives it); returns it admitted."""
        if self.dumped is not None:
            raise InvalidEvent(f"event {event.id} comes after the state of {self.entity_id}")
        if event.entity_id != self.entity_id:
            raise InvalidEvent(f"event {event.id} is filed under entity {self.entity_id}")
        if event.id in self.staging:
            raise InvalidEvent(f"event {event.id} appears twice in the dump")
        if self.collection is None:
            self.collection = event.collection
        elif event.collection != self.collection:
            raise InvalidEvent(
                f"event {event.id} names collection {event.collection!r}, but entity "
                f"{self.entity_id} lives in {self.collection!r}"
            )
        admitted = AdmittedEvent(event, self._generation(claimed, event))
        self.staging.stage(admitted)
        if self.replay is not None:
            self.replay.apply(admitted)
            self.replay.set_head(_head_after(self.replay.head_generations, admitted))
        return admitted

    def _generation(self, claimed: int, event: Event) -> int:
        if event.is_genesis:
            try:
                check_genesis(event, self.rules.root)
            except SystemNotReady:
                raise ForeignSystem(
                    f"entity {self.entity_id} was created in system {event.system}, but the "
                    "dump names no system root"
                ) from None
            if not self.staging:
                self.replay = Entity.empty(self.entity_id, event.collection)
            expected = 1
        else:
            parents = [self.staging.get(p) for p in event.parent]
            known = [p.generation for p in parents if p is not None]
            if len(known) < len(parents):
                return self._open(claimed, event)
            expected = 1 + max(known)
        if claimed != expected:
            raise InvalidEvent(f"event {event.id} has generation {claimed}, not {expected}")
        return expected

    def _open(self, claimed: int, event: Event) -> int:
        """An event whose parents the dump does not hold."""
        missing = [p for p in event.parent if p not in self.staging]
        if not self.rules.ephemeral_dump:
            raise InvalidEvent(
                f"event {event.id} names parent {missing[0]}, which the dump does not hold "
                f"before it (a missing parent): a durable dump holds every entity's whole "
                "history, parents first"
            )
        self.closed, self.replay = False, None
        return claimed

    def state(self, dumped: StoredState) -> None:
        """Take the entity's dumped state (its last record)."""
        if self.dumped is not None:
            raise InvalidState(f"the dump holds two states of {self.entity_id}")
        if dumped.state.entity_id != self.entity_id:
            raise InvalidState(
                f"a state of {dumped.state.entity_id} is filed under entity {self.entity_id}"
            )
        if self.collection not in (None, dumped.state.collection):
            raise InvalidState(
                f"the state of {self.entity_id} names collection {dumped.state.collection!r}, "
                f"its events {self.collection!r}"
            )
        self.dumped = dumped

    def result(self) -> StoredState | None:
        """The state to load (recomputed where it can be), or None (events only).

        Raises InvalidState for a state that does not follow from its events, or that
        comes without them where the dump's kind or the target forbids it.
        """
        if self.replay is not None:
            computed = StoredState(self.replay.to_state(), self.replay.snapshot().values)
            if self.dumped is not None:
                self._same(self.dumped, computed)
            return computed
        if self.dumped is None and self.closed:
            return None  # neither events nor a state: the reader never makes one
        return self._snapshot()

    def _snapshot(self) -> StoredState | None:
        """A state (or events) without its history: only an ephemeral dump into a cache."""
        what = "a state" if self.dumped is not None else "events"
        if not self.rules.ephemeral_dump:
            raise InvalidState(
                f"the dump holds {what} of {self.entity_id} without its history, which only "
                "an ephemeral dump may (a durable dump holds every entity's events)"
            )
        if self.rules.durable_target:
            raise InvalidState(
                f"the dump holds {what} of {self.entity_id} without its history, and a "
                "durable store takes only states it can recompute from the dump's events "
                "(load this ephemeral dump into a cache: durable=False, mycelia load "
                "--ephemeral)"
            )
        if self.dumped is None:
            return None
        try:
            entity = Entity.from_state(self.dumped.state)
        except DecodeError as exc:
            raise InvalidState(f"the state of {self.entity_id} does not decode: {exc}") from exc
        values = entity.snapshot().values
        if encode_values(values) != encode_values(self.dumped.values):
            raise InvalidState(f"the queryable values of {self.entity_id} differ from its state")
        return StoredState(self.dumped.state, values)

    def _same(self, dumped: StoredState, computed: StoredState) -> None:
        ours, theirs = computed.state, dumped.state
        missing = [h for h in theirs.state.head if h not in self.staging]
        if missing:
            raise InvalidState(
                f"the state of {self.entity_id} names head event {missing[0]}, which the "
                "dump does not hold"
            )
        if theirs.state.head_generations() != ours.state.head_generations():
            raise InvalidState(
                f"the state of {self.entity_id} has head {theirs.state.head}, but its events "
                f"give {ours.state.head}: it is older, newer or forged"
            )
        try:
            values = Entity.from_state(theirs).snapshot().values
        except DecodeError as exc:
            raise InvalidState(f"the state of {self.entity_id} does not decode: {exc}") from exc
        if encode_values(values) != encode_values(computed.values):
            raise InvalidState(f"the state of {self.entity_id} holds values its events do not give")
        if encode_values(dumped.values) != encode_values(computed.values):
            raise InvalidState(f"the queryable values of {self.entity_id} differ from its events'")
        buffers = dict(ours.state.buffers)
        for name, buffer in theirs.state.buffers:
            if name != TextBackend.name and buffers.get(name) != buffer:
                raise InvalidState(
                    f"the {name} buffer of {self.entity_id}'s state differs from what its "
                    "events give (a forged writer or generation?)"
                )


def _head_after(head: dict[EventId, int], event: AdmittedEvent) -> dict[EventId, int]:
    """The head of a replay once ``event`` (whose parents are all replayed) is applied."""
    after = {tip: g for tip, g in head.items() if tip not in event.parent}
    after[event.id] = event.generation
    return after


async def merge_with_stored(
    engine: StorageEngine, check: EntityCheck, loaded: StoredState
) -> StoredState | None:
    """``loaded`` joined with the state ``engine`` holds (None: it adds nothing).

    Raises InvalidState for another collection, LineageError if the heads cannot be
    placed in one history.
    """
    entity_id = check.entity_id
    stored = await engine.get_state(entity_id)
    if stored is None:
        return loaded
    incoming = loaded.state
    if stored.collection != incoming.collection:
        raise InvalidState(
            f"the dump's {entity_id} lives in {incoming.collection!r}, the store's in "
            f"{stored.collection!r}"
        )
    durable = check.rules.durable_target
    getter = LocalGetter(check.staging, engine)
    hints = {**stored.state.head_generations(), **incoming.state.head_generations()}
    try:
        outcome = await compare(getter, incoming.state.head, stored.state.head, hints=hints)
    except EventNotFound:
        if durable:
            raise
        head = hints  # a cache's snapshots without history: keep both heads (§7)
    else:
        action = action_for(outcome.relation)
        if action is Action.NOTHING:
            return None
        if action is Action.REJECT:
            raise rejection(outcome.relation, entity_id)
        head = dict(outcome.merged_head)
    entity = Entity.from_state(stored)
    entity.merge_state(incoming)
    entity.set_head(head)
    return StoredState(entity.to_state(), entity.snapshot().values)
