"""Prometheus metrics for one node: :class:`Metrics` (``GET /metrics``, ARCHITECTURE.md §9).

Invariants:

- Each :class:`Metrics` owns its own ``CollectorRegistry``: two servers in one process
  never share or clash; the text is always ``prometheus_client``'s own exposition format.
- Every metric has one writer, named by a method here (``sent``, ``refused``,
  ``observe_commit``...). The server and its wire tap call the ones they can see; the
  rest are hooks for the node's internals (see each method), which are no-ops until
  called: a metric that nobody feeds stays at zero, it never lies.
- Gauges read at scrape time (subscriptions, storage size) call plain functions that do
  no I/O beyond a ``stat``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

if TYPE_CHECKING:
    from mycelia.entity import EntityChange
    from mycelia.node.node import Node

__all__ = ["CONTENT_TYPE", "ConnectionMeter", "Metrics"]

CONTENT_TYPE: Final = CONTENT_TYPE_LATEST
LATENCY_BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""Seconds: commits take from well under a millisecond (memory) to seconds (a slow disk)."""


class Metrics:
    """The metrics of one node (see the module docstring)."""

    def __init__(self, *, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self._info = Info("mycelia", "This node: package version and node id", registry=r)
        self._connections = Gauge(
            "mycelia_connections",
            "Open peer connections by transport and peer kind (handshaking, ephemeral, durable)",
            ["transport", "peer"],
            registry=r,
        )
        self._accepted = Counter(
            "mycelia_connections_accepted", "Connections accepted", ["transport"], registry=r
        )
        self._closed = Counter(
            "mycelia_connections_closed",
            "Connections closed, by reason (closed, or the error class that ended them)",
            ["reason"],
            registry=r,
        )
        self._bytes = Counter(
            "mycelia_bytes", "Frame bytes received (in) and sent (out)", ["direction"], registry=r
        )
        self._frames = Counter(
            "mycelia_frames", "Frames received (in) and sent (out)", ["direction"], registry=r
        )
        self._requests = Histogram(
            "mycelia_request_seconds",
            "Seconds from a peer's request frame arriving to its response leaving, by request",
            ["request"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._refused = Counter(
            "mycelia_refused",
            "Requests answered with an error and connections refused, by reason (error class)",
            ["reason"],
            registry=r,
        )
        # Bound once: every frame counts twice, and ``labels()`` looks its child up under
        # a lock each time.
        self._frames_in, self._frames_out = self._frames.labels("in"), self._frames.labels("out")
        self._bytes_in, self._bytes_out = self._bytes.labels("in"), self._bytes.labels("out")
        self._define_storage_metrics(r)

    def _define_storage_metrics(self, r: CollectorRegistry) -> None:
        self._commits = Counter(
            "mycelia_commits",
            "Commits that changed entities (local, from peers, and other servers' in the "
            "collections this node's live queries and subscriptions read)",
            registry=r,
        )
        self._events = Counter(
            "mycelia_events_ingested", "Events applied, by collection", ["collection"], registry=r
        )
        self._entities = Counter(
            "mycelia_entity_changes", "Entities changed, by collection", ["collection"], registry=r
        )
        self._commit_seconds = Histogram(
            "mycelia_commit_seconds",
            "Seconds per commit, from its events to durable (origin: local or remote)",
            ["origin"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._write_seconds = Histogram(
            "mycelia_storage_write_seconds",
            "Seconds per durable storage write (LMDB: commit and fsync; PostgreSQL: COMMIT)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._outbox = Gauge("mycelia_outbox_events", "Events owed to the durable peer", registry=r)
        self._live = Gauge("mycelia_live_queries", "Live queries open on this node", registry=r)
        self._subscriptions = Gauge(
            "mycelia_subscriptions", "Standing queries held for peers", registry=r
        )
        self._storage_bytes = Gauge(
            "mycelia_storage_bytes", "Bytes the store takes on disk (LMDB files)", registry=r
        )

    # -- what the server sees --------------------------------------------------------------

    def watch(self, node: Node, *, version: str) -> Callable[[], None]:
        """Feed the commit counters from ``node.on_change`` and read its gauges at scrape
        time (subscriptions; storage size for a store with a ``path``). Returns a remover."""
        self._info.info({"version": version, "node_id": str(node.node_id)})
        self._subscriptions.set_function(lambda: node.stats().subscriptions)
        path = getattr(node.storage, "path", None)
        if isinstance(path, Path):
            self._storage_bytes.set_function(lambda: _directory_size(path))
        return node.on_change(self.changed, everything=False)

    def connection(self, transport: str) -> ConnectionMeter:
        """A new connection over ``transport`` (``websocket``, ``asgi``): handshaking."""
        self._accepted.labels(transport).inc()
        return ConnectionMeter(self._connections, self._closed, transport)

    def received(self, size: int) -> None:
        """A frame of ``size`` bytes arrived."""
        self._frames_in.inc()
        self._bytes_in.inc(size)

    def sent(self, size: int) -> None:
        """A frame of ``size`` bytes left."""
        self._frames_out.inc()
        self._bytes_out.inc(size)

    def observe_request(self, request: str, seconds: float) -> None:
        """A request (``GetRequest``, ``CommitRequest``...) was answered in ``seconds``."""
        self._requests.labels(request).observe(seconds)

    def refused(self, reason: str) -> None:
        """A request or connection was refused; ``reason`` is the error class's name."""
        self._refused.labels(reason).inc()

    def changed(self, changes: list[EntityChange]) -> None:
        """One commit changed these entities (the ``node.on_change`` listener): each
        collection's counters move once per commit, not once per entity (a label lookup
        takes a lock; a fresh client's sync reports a thousand entities at once)."""
        self._commits.inc()
        per_collection: dict[str, list[int]] = {}
        for change in changes:
            counts = per_collection.setdefault(change.after.collection, [0, 0])
            counts[0] += 1
            counts[1] += len(change.events)
        for collection, (entities, events) in per_collection.items():
            self._entities.labels(collection).inc(entities)
            self._events.labels(collection).inc(events)

    # -- hooks for the node's internals ----------------------------------------------------

    def observe_commit(self, seconds: float, *, origin: str) -> None:
        """A commit (``origin``: ``local`` or ``remote``) took ``seconds`` to be durable."""
        self._commit_seconds.labels(origin).observe(seconds)

    def observe_storage_write(self, seconds: float) -> None:
        """One durable storage write (LMDB commit + fsync, PostgreSQL COMMIT) took ``seconds``."""
        self._write_seconds.observe(seconds)

    def outbox_depth(self, events: int) -> None:
        """The outbox now owes ``events`` events to the durable peer."""
        self._outbox.set(events)

    def live_queries(self, count: int) -> None:
        """``count`` live queries are open on this node."""
        self._live.set(count)

    # -- exposition ------------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric (``prometheus_client`` writes it)."""
        return generate_latest(self.registry)


class ConnectionMeter:
    """One connection's place in ``mycelia_connections``: handshaking, then its peer kind."""

    def __init__(self, gauge: Gauge, closed: Counter, transport: str) -> None:
        self._gauge = gauge
        self._closed = closed
        self._transport = transport
        self._peer = "handshaking"
        self._gauge.labels(transport, self._peer).inc()

    def ready(self, *, durable: bool) -> None:
        """The handshake completed: count the connection under its peer kind."""
        self._move("durable" if durable else "ephemeral")

    def closed(self, reason: str) -> None:
        """The connection ended (``reason``: ``closed`` or the error class's name)."""
        if self._peer:
            self._gauge.labels(self._transport, self._peer).dec()
            self._peer = ""
            self._closed.labels(reason).inc()

    def _move(self, peer: str) -> None:
        if self._peer:
            self._gauge.labels(self._transport, self._peer).dec()
            self._peer = peer
            self._gauge.labels(self._transport, peer).inc()


def _directory_size(path: Path) -> int:
    """The bytes the regular files directly in ``path`` take (0 if it is gone)."""
    total = 0
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
    except OSError:
        return 0
    return total
