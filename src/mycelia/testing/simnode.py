"""One simulated node: storage that outlives crashes, the Node while it is up, its peering.

Invariants:

- ``storage`` survives a crash of a durable node (the restarted :class:`~mycelia.Node` is
  opened on the very same engine object, as a process restarted on its data directory
  would be); an ephemeral node that loses its cache restarts on a new, empty engine and
  rejoins the system.
- Every incarnation gets its own seeded ``rng`` (derived from the run's seed, the node's
  index and the incarnation number), so node keys, genesis nonces, handshake challenges
  and text client ids are reproducible and never reused by a later incarnation.
- An ephemeral node keeps a real :class:`~mycelia.node.client.Connection` to a durable
  node while it is up: each dial picks, with the run's generator, one of the durable
  nodes it can reach (a client failing over between servers). A durable node serves the
  streams dialed to it with real :class:`~mycelia.node.peer.PeerConnection` s, which die
  with it when it crashes.
- ``known`` mirrors, from the node's change notifications, which entities it holds and
  whether they are deleted; it is rebuilt from storage on restart.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from typing import Final

from mycelia.entity import DELETED, EntityChange
from mycelia.entity.model import Model
from mycelia.node import Node
from mycelia.node.client import Connection
from mycelia.node.transport import Transport
from mycelia.proto import AdmittedEvent, EntityId, Event
from mycelia.testing.faults import FaultyStorage
from mycelia.testing.fields import field_kinds
from mycelia.testing.invariants import WatchedQuery
from mycelia.testing.links import Links

__all__ = ["REQUEST_TIMEOUT", "SimNode", "watch_queries"]

REQUEST_TIMEOUT: Final = 40.0
"""Ticks a simulated request may wait for its answer."""
HANDSHAKE_TIMEOUT: Final = 20.0
MIN_BACKOFF: Final = 1.0
MAX_BACKOFF: Final = 16.0


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
        self.connection: Connection | None = None
        self.incarnation = 0
        self.known: dict[EntityId, tuple[str, bool]] = {}
        self.fresh: list[EntityChange] = []
        self.watched: list[WatchedQuery[Model]] = []
        self.crash_after_failure = False
        self._serving: dict[asyncio.Task[None], None] = {}

    @property
    def up(self) -> bool:
        """Whether the node is running."""
        return self.node is not None

    def rng(self, purpose: str = "node") -> random.Random:
        """The entropy of the current incarnation, for one purpose."""
        seed = f"mycelia-sim/{purpose}/{self._seed}/{self.index}/{self.incarnation}"
        return random.Random(seed)

    async def start(
        self,
        system: Sequence[Event],
        models: Sequence[type[Model]],
        *,
        watch: bool = True,
        narrow: bool = False,
    ) -> Node:
        """Open a Node on ``storage`` (joining ``system`` if the storage has none); with
        ``watch``, open its live queries (``narrow``: see :func:`watch_queries`)."""
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
        self.watched = await watch_queries(node, models, narrow=narrow) if watch else []
        return node

    def connect(self, dial: Callable[[SimNode], Transport]) -> None:
        """Keep this (ephemeral) node connected through ``dial``, which opens a stream to a
        durable node it can reach (or raises ConnectionRefusedError)."""
        assert self.node is not None

        async def redial() -> Transport:
            return dial(self)

        self.connection = self.node.attach(
            redial,
            token=None,
            min_backoff=MIN_BACKOFF,
            max_backoff=MAX_BACKOFF,
            request_timeout=REQUEST_TIMEOUT,
            rng=self.rng("backoff"),
        )
        self.connection.start()

    def serve(self, links: Links, client: int) -> Transport:
        """Accept a stream dialed by node ``client`` (this node must be a durable one that is
        up); returns the client's end."""
        assert self.node is not None
        stream = links.open(client, self.index)
        peer = self.node.accept(
            stream.server,
            request_timeout=REQUEST_TIMEOUT,
            handshake_timeout=HANDSHAKE_TIMEOUT,
            outgoing_frames=4096,
        )
        task = asyncio.ensure_future(peer.run())
        self._serving[task] = None
        task.add_done_callback(lambda done: self._serving.pop(done, None))
        return stream.client

    async def crash(self, links: Links, *, lose_cache: bool) -> None:
        """Stop: the Node is abandoned mid-flight (its storage is not closed); its streams and
        the connections it served die with it."""
        self.node = None
        self.watched = []
        self.fresh = []
        self.crash_after_failure = False
        links.node_down(self.index)
        for task in list(self._serving):
            task.cancel()
        await asyncio.gather(*self._serving, return_exceptions=True)
        if self.connection is not None:
            connection, self.connection = self.connection, None
            await connection.close()
        if lose_cache and not self.durable:
            self.storage = FaultyStorage()

    def _on_change(self, changes: list[EntityChange]) -> None:
        for change in changes:
            after = change.after
            if after.exists:
                self.known[after.entity_id] = (after.collection, after.deleted)
            else:
                self.known.pop(after.entity_id, None)  # reverted away by the durable peer
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


async def watch_queries(
    node: Node, models: Sequence[type[Model]], *, narrow: bool = False
) -> list[WatchedQuery[Model]]:
    """Open the live queries a simulated node keeps: per model, every entity, and (when it
    has an orderable field) a LIMIT query ordered on it. A ``narrow`` node keeps only a
    range of each model that has a numeric field (``<field> < 0``): rows it edits leave
    and enter it, and its subscriptions hold nothing of the others."""
    ctx = node.context()
    out: list[WatchedQuery[Model]] = []
    for model in models:
        if narrow:
            numeric = [f for f in field_kinds(model) if f.kind in ("int", "float")]
            if numeric:
                out.append(await WatchedQuery.open(ctx, model, f"{numeric[0].name} < 0"))
            continue
        out.append(await WatchedQuery.open(ctx, model, ""))
        orderable = [f for f in field_kinds(model) if f.kind in ("int", "str", "float")]
        if orderable:
            name = orderable[0].name
            query = f"{name} IS NOT NULL ORDER BY {name} LIMIT 3"
            out.append(await WatchedQuery.open(ctx, model, query))
    return out
