"""How simulated durable nodes replicate: push after commit, want what is missing, digests.

The :class:`Replicator` sends and handles :mod:`mycelia.testing.wire` messages between the
simulator's **durable** nodes (ephemeral ones are clients: they use the real peering
protocol, see :mod:`mycelia.testing.links`):

- after a local commit a node **pushes** the new events to its durable peers;
- a node that receives events whose parents it lacks holds them (the applier's pending
  pool) and sends the sender a **want** for the missing ids; the sender answers with them
  and their ancestors (storage read-ahead);
- a **digest** ("my head of every entity I hold") is answered with every event the sender
  lacks, computed from the receiver's DAG; a digest that shows the sender holds what the
  receiver lacks is answered with a digest the other way. Gossip sends digests
  periodically, so any loss is eventually repaired.

Refusals a fault explains (a truncated message's DecodeError, an injected storage failure,
a foreign system's events) are counted; any other error from a node on valid traffic is an
:class:`~mycelia.testing.invariants.UnexpectedError` — a bug the simulation found.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from mycelia.errors import DecodeError, ForeignSystem, MyceliaError
from mycelia.proto import AdmittedEvent, Clock, EntityId, Event, EventId
from mycelia.testing.dags import ancestry
from mycelia.testing.faults import InjectedFailure
from mycelia.testing.invariants import UnexpectedError
from mycelia.testing.network import INTRUDER, Envelope, Network
from mycelia.testing.simnode import SimNode
from mycelia.testing.trace import Trace
from mycelia.testing.wire import Digest, Push, SimMessage, Want, decode, encode

__all__ = ["PUSH_CHUNK", "Replicator"]

PUSH_CHUNK: Final = 200
"""Most events in one push."""
WANT_AHEAD: Final = 64
"""Ancestors added to an answer to a want (storage read-ahead)."""


class Replicator:
    """Sends and handles replication messages for a simulation's nodes."""

    def __init__(self, nodes: Sequence[SimNode], network: Network, trace: Trace) -> None:
        self.nodes = nodes
        self.network = network
        self.trace = trace
        self.counts: dict[str, int] = {}
        self.stored = 0
        """Events stored by deliveries so far (quiescence: a round that stores none)."""

    def count(self, what: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``what``."""
        self.counts[what] = self.counts.get(what, 0) + n

    def send(self, src: int, dst: int, msg: SimMessage) -> None:
        """Encode ``msg`` and put it on the wire."""
        self.network.send(src, dst, encode(msg))

    def push(self, src: int, dst: int, events: Sequence[Event | AdmittedEvent]) -> None:
        """Push events (already parents first) in chunks."""
        plain = [e.event if isinstance(e, AdmittedEvent) else e for e in events]
        for i in range(0, len(plain), PUSH_CHUNK):
            self.send(src, dst, Push(tuple(plain[i : i + PUSH_CHUNK])))

    def broadcast(self, sn: SimNode, events: Sequence[AdmittedEvent]) -> None:
        """Push a local commit's events to every peer."""
        for peer in sn.peers:
            self.push(sn.index, peer, events)

    async def digest(self, sn: SimNode, dst: int, *, reply: bool = True) -> None:
        """Send ``dst`` this node's head of every entity it holds."""
        states = await sn.storage.get_states(sorted(sn.known))
        heads = tuple((e, states[e].state.head) for e in sorted(states))
        self.send(sn.index, dst, Digest(heads, reply))

    async def deliver(self, env: Envelope) -> None:
        """Hand one message to its destination (see the module docstring)."""
        sn = self.nodes[env.dst]
        if sn.node is None or self.network.cut(env.src, env.dst):
            self.trace.record("lost", self.network.clock.now, env.src, env.dst)
            self.count("lost in flight")
            return
        try:
            msg = decode(env.payload, limits=sn.node.limits)
        except DecodeError as exc:
            if not env.corrupted:
                raise UnexpectedError(f"refused an intact message: {exc!r}", node=sn.name) from exc
            self.trace.record("refused", self.network.clock.now, env.dst, type(exc).__name__)
            self.count("corrupt refused")
            return
        self.trace.record("recv", self.network.clock.now, env.src, env.dst, type(msg).__name__)
        self.count("delivered")
        if isinstance(msg, Push):
            await self._on_push(sn, env.src, msg.events)
        elif isinstance(msg, Want):
            await self._on_want(sn, env.src, msg.ids)
        else:
            await self._on_digest(sn, env.src, msg)

    async def _on_push(self, sn: SimNode, src: int, events: Sequence[Event]) -> None:
        assert sn.node is not None
        self.count("pushes ingested")
        try:
            result = await sn.node.ingest(events)
        except ForeignSystem as exc:
            if src != INTRUDER:
                raise UnexpectedError(f"refused events from {src}: {exc!r}", node=sn.name) from exc
            self.count("foreign refused")
            self.trace.record("refused", self.network.clock.now, sn.index, "ForeignSystem")
            return
        except InjectedFailure:
            self.count("writes failed")
            self.trace.record("failed", self.network.clock.now, sn.index, "write")
            return
        except MyceliaError as exc:
            raise UnexpectedError(f"refused events from {src}: {exc!r}", node=sn.name) from exc
        self.stored += len(result.stored)
        self.trace.record(
            "stored", self.network.clock.now, sn.index, sorted(bytes(e.id) for e in result.stored)
        )
        if src == INTRUDER:
            return
        if result.missing:
            self.send(sn.index, src, Want(tuple(sorted(result.missing))))

    async def _on_want(self, sn: SimNode, src: int, ids: Sequence[EventId]) -> None:
        found = await sn.storage.get_events(ids, ahead=WANT_AHEAD)
        events = sorted(found.values(), key=lambda e: (e.generation, e.id))
        if events:
            self.push(sn.index, src, events)

    async def _on_digest(self, sn: SimNode, src: int, digest: Digest) -> None:
        theirs = dict(digest.heads)
        mine = await sn.storage.get_states(sorted(sn.known))
        lacking: list[AdmittedEvent] = []
        they_have_more = any(e not in mine for e in theirs)
        for entity_id in sorted(mine):
            head = mine[entity_id].state.head
            their_head = theirs.get(entity_id)
            if their_head == head:
                continue
            missing, unknown = await self._lacking(sn, entity_id, their_head)
            lacking.extend(missing)
            they_have_more = they_have_more or unknown
        if lacking:
            self.push(sn.index, src, lacking)
        if they_have_more and digest.reply:
            await self.digest(sn, src, reply=False)

    async def _lacking(
        self, sn: SimNode, entity_id: EntityId, their_head: Clock | None
    ) -> tuple[list[AdmittedEvent], bool]:
        """Events of ``entity_id`` a peer at ``their_head`` lacks, and whether that head
        names events this node lacks."""
        events = await sn.storage.events_of(entity_id)
        if their_head is None:
            return events, False
        parents = {e.id: e.parent for e in events}
        known = [i for i in their_head if i in parents]
        covered = ancestry(parents, known)
        return [e for e in events if e.id not in covered], len(known) < len(their_head)
