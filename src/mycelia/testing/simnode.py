"""One simulated node: storage that outlives crashes, the Node while it is up, what is watched.

Invariants:

- ``storage`` survives a crash of a durable node (the restarted :class:`~mycelia.Node` is
  opened on the very same engine object, as a process restarted on its data directory
  would be); an ephemeral node that loses its cache restarts on a new, empty engine and
  rejoins the system.
- Every incarnation gets its own seeded ``rng`` (derived from the run's seed, the node's
  index and the incarnation number), so node keys, genesis nonces and text client ids are
  reproducible and never reused by a later incarnation.
- ``known`` mirrors, from the node's change notifications, which entities it holds and
  whether they are deleted; it is rebuilt from storage on restart.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from mycelia.entity import DELETED, EntityChange
from mycelia.entity.model import Model
from mycelia.node import Node
from mycelia.proto import AdmittedEvent, EntityId, Event
from mycelia.testing.faults import FaultyStorage
from mycelia.testing.fields import field_kinds
from mycelia.testing.invariants import WatchedQuery

__all__ = ["SimNode", "watch_queries"]


class SimNode:
    """A simulated node; the simulation drives it (see the module docstring)."""

    def __init__(self, index: int, *, durable: bool, seed: int, peers: tuple[int, ...]) -> None:
        self.index = index
        self.durable = durable
        self.name = f"{'d' if durable else 'e'}{index}"
        self.peers = peers
        self._seed = seed
        self.storage = FaultyStorage()
        self.node: Node | None = None
        self.incarnation = 0
        self.known: dict[EntityId, tuple[str, bool]] = {}
        self.fresh: list[EntityChange] = []
        self.watched: list[WatchedQuery[Model]] = []
        self.crash_after_failure = False

    @property
    def up(self) -> bool:
        """Whether the node is running."""
        return self.node is not None

    def rng(self) -> random.Random:
        """The entropy of the current incarnation."""
        return random.Random(f"mycelia-sim/node/{self._seed}/{self.index}/{self.incarnation}")

    async def start(
        self, system: Sequence[Event], models: Sequence[type[Model]], *, watch: bool = True
    ) -> Node:
        """Open a Node on ``storage`` (joining ``system`` if the storage has none); with
        ``watch``, open its live queries."""
        self.incarnation += 1
        node = await Node.open(self.storage, durable=self.durable, rng=self.rng())
        if node.system_root is None and system:
            await node.join_system(system)
        self.node = node
        self.known = {}
        for model in models:
            for stored in await self.storage.scan(model.__collection__):
                deleted = stored.values.get(DELETED) is True
                self.known[stored.state.entity_id] = (model.__collection__, deleted)
        node.on_change(self._on_change)
        self.watched = await watch_queries(node, models) if watch else []
        return node

    def crash(self, *, lose_cache: bool) -> None:
        """Stop: the Node object is abandoned mid-flight (nothing is flushed or closed)."""
        self.node = None
        self.watched = []
        self.fresh = []
        self.crash_after_failure = False
        if lose_cache and not self.durable:
            self.storage = FaultyStorage()

    def _on_change(self, changes: list[EntityChange]) -> None:
        for change in changes:
            after = change.after
            if after.exists:
                self.known[after.entity_id] = (after.collection, after.deleted)
        self.fresh.extend(changes)

    def take_fresh(self) -> list[AdmittedEvent]:
        """The events applied since the last call, parents first."""
        events = [e for change in self.fresh for e in change.events]
        self.fresh = []
        return events

    def alive(self, collection: str) -> list[EntityId]:
        """The live (not deleted) entities of ``collection`` this node holds, by id."""
        return sorted(
            e for e, (c, deleted) in self.known.items() if c == collection and not deleted
        )


async def watch_queries(node: Node, models: Sequence[type[Model]]) -> list[WatchedQuery[Model]]:
    """Open the live queries a simulated node keeps: per model, every entity, and (when it
    has an orderable field) a LIMIT query ordered on it."""
    ctx = node.context()
    out: list[WatchedQuery[Model]] = []
    for model in models:
        out.append(await WatchedQuery.open(ctx, model, ""))
        orderable = [f for f in field_kinds(model) if f.kind in ("int", "str", "float")]
        if orderable:
            name = orderable[0].name
            query = f"{name} IS NOT NULL ORDER BY {name} LIMIT 3"
            out.append(await WatchedQuery.open(ctx, model, query))
    return out
