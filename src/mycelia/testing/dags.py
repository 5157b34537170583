"""Build event DAGs by name, and generate them with hypothesis (public test helpers).

:class:`Dag` mints real events (content-hashed, generations computed as a receiver would)
from a readable description::

    dag = Dag()
    dag.root("G")
    dag.child("A", "G")
    dag.child("B", "G")
    dag.child("M", "A", "B")
    dag.clock("A", "B")          # a Clock of those events' ids

:func:`dag_shapes` draws random shapes (forks, merges, long chains, diamonds, extra roots)
and :func:`ancestry` / :func:`oracle_relation` are the brute-force model the comparison is
checked against (ARCHITECTURE.md §4).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hypothesis import strategies as st

from mycelia.event_dag.relation import (
    Disjoint,
    DivergedSince,
    Equal,
    Relation,
    StrictAscends,
    StrictDescends,
)
from mycelia.proto import EMPTY_CLOCK, AdmittedEvent, Clock, EntityId, Event, EventId

__all__ = ["Dag", "DagShape", "ancestry", "dag_shapes", "oracle_relation"]

_LABEL = "x_label"
"""The backend name of the default operations: opaque to nodes, so any node accepts them."""


class Dag:
    """Named events of one DAG, with generations; see the module docstring."""

    def __init__(self, *, collection: str = "things", system: EntityId | None = None) -> None:
        self.collection = collection
        self.system = system
        self.events: dict[EventId, AdmittedEvent] = {}
        self.by_name: dict[str, AdmittedEvent] = {}
        self._entity: EntityId | None = None

    @property
    def entity_id(self) -> EntityId:
        """The entity of the first root (every update is minted for it)."""
        if self._entity is None:
            raise ValueError("add a root first")
        return self._entity

    def root(
        self, name: str, *, salt: bytes = b"", ops: Mapping[str, list[bytes]] | None = None
    ) -> AdmittedEvent:
        """A genesis named ``name`` (the first one is the DAG's entity)."""
        nonce = (name.encode() + salt + bytes(16))[:16]
        event = Event.genesis(
            collection=self.collection,
            system=self.system,
            operations=ops if ops is not None else {_LABEL: [name.encode() + salt]},
            nonce=nonce,
        )
        if self._entity is None:
            self._entity = event.entity_id
        return self._add(name, AdmittedEvent(event, 1))

    def child(
        self,
        name: str,
        *parents: str,
        salt: bytes = b"",
        ops: Mapping[str, list[bytes]] | None = None,
    ) -> AdmittedEvent:
        """An update named ``name`` on the named parents."""
        parent_events = [self.by_name[p] for p in parents]
        event = Event.update(
            entity_id=self.entity_id,
            collection=self.collection,
            parent=Clock(p.id for p in parent_events),
            operations=ops if ops is not None else {_LABEL: [name.encode() + salt]},
        )
        generation = 1 + max(p.generation for p in parent_events)
        return self._add(name, AdmittedEvent(event, generation))

    def child_with_id_order(
        self, name: str, *parents: str, above: str | None = None, below: str | None = None
    ) -> AdmittedEvent:
        """Like :meth:`child`, salted until its id sorts above/below the named events."""
        for attempt in range(10_000):
            salt = attempt.to_bytes(4, "big")
            candidate = Event.update(
                entity_id=self.entity_id,
                collection=self.collection,
                parent=Clock(self.by_name[p].id for p in parents),
                operations={_LABEL: [name.encode() + salt]},
            )
            if above is not None and not candidate.id > self.by_name[above].id:
                continue
            if below is not None and not candidate.id < self.by_name[below].id:
                continue
            return self.child(name, *parents, salt=salt)
        raise ValueError(f"no salt orders {name} as asked")  # pragma: no cover

    def _add(self, name: str, event: AdmittedEvent) -> AdmittedEvent:
        self.events[event.id] = event
        self.by_name[name] = event
        return event

    def __getitem__(self, name: str) -> AdmittedEvent:
        return self.by_name[name]

    def id(self, name: str) -> EventId:
        """The id of the named event."""
        return self.by_name[name].id

    def clock(self, *names: str) -> Clock:
        """The clock of the named events."""
        return Clock(self.by_name[n].id for n in names)

    def name_of(self, event_id: EventId) -> str:
        """The name an event was added under."""
        for name, event in self.by_name.items():
            if event.id == event_id:
                return name
        raise KeyError(event_id)

    def names(self, ids: Iterable[EventId]) -> set[str]:
        """The names of ``ids``."""
        return {self.name_of(i) for i in ids}


def ancestry(parents: Mapping[EventId, Clock], clock: Iterable[EventId]) -> set[EventId]:
    """Inclusive ancestry of ``clock`` over a parent map (unknown ids are leaves)."""
    seen: set[EventId] = set()
    stack = list(clock)
    while stack:
        eid = stack.pop()
        if eid in seen:
            continue
        seen.add(eid)
        stack.extend(parents.get(eid, EMPTY_CLOCK))
    return seen


def oracle_relation(parents: Mapping[EventId, Clock], subject: Clock, other: Clock) -> Relation:
    """The relation by brute force over ancestor sets (the model, ARCHITECTURE.md §4)."""
    if subject == other:
        return Equal()
    if not subject or not other:
        return DivergedSince(EMPTY_CLOCK)
    a_s, a_o = ancestry(parents, subject), ancestry(parents, other)
    roots_s = {e for e in a_s if not parents.get(e)}
    roots_o = {e for e in a_o if not parents.get(e)}
    if a_o <= a_s and roots_s <= a_o:
        return StrictDescends()
    if a_s <= a_o:
        return StrictAscends()
    common = a_s & a_o
    if not common:
        return Disjoint(Clock(roots_s), Clock(roots_o))
    if any(not (ancestry(parents, [h]) & a_s) for h in other):
        return DivergedSince(EMPTY_CLOCK)
    below = set()
    for c in common:
        below |= ancestry(parents, parents.get(c, EMPTY_CLOCK))
    return DivergedSince(Clock(common - below))


@dataclass(frozen=True)
class DagShape:
    """A drawn DAG: ``parents[i]`` are the indices of event ``i``'s parents (empty: a root)."""

    parents: tuple[tuple[int, ...], ...]

    def build(self) -> tuple[Dag, list[AdmittedEvent]]:
        """Mint the events (named ``e0``, ``e1``, ...) in index order."""
        dag = Dag()
        events = []
        for i, ps in enumerate(self.parents):
            name = f"e{i}"
            events.append(dag.child(name, *(f"e{p}" for p in ps)) if ps else dag.root(name))
        return dag, events


@st.composite
def dag_shapes(
    draw: st.DrawFn,
    *,
    min_events: int = 1,
    max_events: int = 12,
    extra_roots: bool = True,
    max_parents: int = 3,
) -> DagShape:
    """Random DAG shapes: chains, forks, merges, diamonds and (optionally) extra roots."""
    n = draw(st.integers(min_events, max_events))
    parents: list[tuple[int, ...]] = [()]
    for i in range(1, n):
        if extra_roots and draw(st.integers(0, 9)) == 0:
            parents.append(())
            continue
        style = draw(st.sampled_from(["chain", "fork", "merge"]))
        if style == "chain":
            parents.append((i - 1,))
        elif style == "fork":
            parents.append((draw(st.integers(0, i - 1)),))
        else:
            k = draw(st.integers(1, min(max_parents, i)))
            chosen: Sequence[int] = draw(
                st.lists(st.integers(0, i - 1), min_size=k, max_size=k, unique=True)
            )
            parents.append(tuple(sorted(chosen)))
    return DagShape(tuple(parents))
