"""Concurrent histories of one entity, minted without a node (public test helper).

A :class:`History` is a DAG shape (from :func:`~mycelia.testing.dags.dag_shapes`, one
root) whose events are labelled with the node that made them and the LWW writes each one
carries. :meth:`History.events` mints real events for a system (genesis first, then
updates in index order, which is a topological order), and :meth:`History.by_node` splits
them into each node's own concurrent list.

Invariants:

- Every event is a valid event of the model's collection: the genesis writes every
  required field, updates write LWW fields only (text edits need a node: use the
  simulator), values pass the model's checks.
- Event ids are distinct even when two siblings write the same values: each event carries
  its index under the opaque backend ``x_history`` (unknown backends are kept by every
  node, ARCHITECTURE.md §5), so the shape is exactly the DAG that gets minted.
- The same History and system always mint the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from mycelia.entity.backends.lww import encode_diff
from mycelia.entity.model import Model
from mycelia.entity.values import encode_value
from mycelia.proto import Clock, EntityId, Event
from mycelia.proto.event import NONCE_LENGTH
from mycelia.testing.dags import DagShape

__all__ = ["LABEL_BACKEND", "History"]

LABEL_BACKEND = "x_history"
"""The opaque backend that makes every event of a history distinct."""

Writes = tuple[tuple[str, object], ...]


@dataclass(frozen=True)
class History:
    """Several nodes' concurrent events for one entity; see the module docstring."""

    model: type[Model]
    shape: DagShape
    """``shape.parents[i]``: the parents of event ``i`` (event 0 is the only root)."""
    authors: tuple[int, ...]
    """The node that made each event."""
    writes: tuple[Writes, ...]
    """The LWW writes of each event (field name, value)."""
    nonce: bytes = bytes(NONCE_LENGTH)
    nodes: int = 1

    def __post_init__(self) -> None:
        n = len(self.shape.parents)
        if not n or self.shape.parents[0] or any(not p for p in self.shape.parents[1:]):
            raise ValueError("a history has exactly one root, event 0")
        if len(self.authors) != n or len(self.writes) != n:
            raise ValueError("a history needs one author and one write set per event")

    def events(self, system: EntityId) -> list[Event]:
        """Every event, minted for ``system``: genesis first, then index order."""
        collection = self.model.__collection__
        genesis = Event.genesis(
            collection=collection,
            system=system,
            operations=self._operations(0),
            nonce=self.nonce,
        )
        events = [genesis]
        for i, parents in enumerate(self.shape.parents[1:], start=1):
            events.append(
                Event.update(
                    entity_id=genesis.entity_id,
                    collection=collection,
                    parent=Clock(events[p].id for p in parents),
                    operations=self._operations(i),
                )
            )
        return events

    def by_node(self, system: EntityId) -> list[list[Event]]:
        """Each node's own events (in causal order); together they are :meth:`events`."""
        out: list[list[Event]] = [[] for _ in range(self.nodes)]
        for author, event in zip(self.authors, self.events(system), strict=True):
            out[author].append(event)
        return out

    def expected_values_in(self, system: EntityId) -> dict[str, object]:
        """Per field, the value written by the largest (generation, event id) writer."""
        events = self.events(system)
        generations: list[int] = []
        for parents in self.shape.parents:
            generations.append(1 + max((generations[p] for p in parents), default=0))
        best: dict[str, tuple[int, bytes, object]] = {}
        for i, writes in enumerate(self.writes):
            rank = (generations[i], bytes(events[i].id))
            for name, value in writes:
                current = best.get(name)
                # Within one event the later write wins (same rank), as in a diff.
                if current is None or rank >= (current[0], current[1]):
                    best[name] = (*rank, value)
        return {name: entry[2] for name, entry in best.items()}

    def _operations(self, index: int) -> dict[str, list[bytes]]:
        ops: dict[str, list[bytes]] = {LABEL_BACKEND: [index.to_bytes(4, "big")]}
        writes = self.writes[index]
        if writes:
            specs = self.model._fields
            encoded = {name: encode_value(specs[name].check(value)) for name, value in writes}
            ops["lww"] = [encode_diff(encoded)]
        return ops
