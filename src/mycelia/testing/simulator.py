"""A deterministic multi-node simulator with faults (ARCHITECTURE.md §12).

A :class:`Simulation` runs real :class:`~mycelia.Node` s — durable and ephemeral, each on
its own (fault-injectable) :class:`~mycelia.storage.MemoryStorage` — in one event loop on
virtual time (:mod:`~mycelia.testing.vloop`: run it with :func:`run_virtual`). Ephemeral
nodes are clients: each keeps a real connection to a durable node it can reach, over
simulated streams (:mod:`~mycelia.testing.links`), so the whole client side — session,
upstream, commit pipeline, subscriptions, read-through — and the server side — responder,
group commit, pushes — run as in production, with connection resets, corrupted frames,
delays, partitions and crashes. Durable nodes replicate among themselves by gossip over a
faulty :class:`~mycelia.testing.network.Network` that carries only bytes (a deployment
shares one database instead). The simulation performs :mod:`~mycelia.testing.actions`
(commits through real transactions, crashes, partitions, failing writes, intrusions) one
per tick; between actions the network delivers what is due and durable nodes gossip.

Invariants:

- **Determinism.** Everything random is drawn from generators seeded by the run's seed
  (string seeds, so the process's hash seed does not matter); nothing reads a wall clock,
  sleeps, or iterates a hash table to decide what to do. The same seed, config and actions
  give the same trace, byte for byte (:attr:`Trace.digest`).
- **Acknowledged means returned.** A commit is acknowledged when its transaction returned.
  An ephemeral node's acknowledged commit that no other node had received when the node
  lost its cache is *forfeited* (its store is gone, by definition of a cache; the trace
  records it) and excluded from the lost-commit check; every other acknowledged commit must
  be on every durable node at the end.
- **Heal and quiesce.** :meth:`Simulation.quiesce` turns every fault off, heals the
  network, restarts stopped nodes, lets every client reconnect and push what it owes, and
  exchanges digests until a round stores nothing and no frame moves; only then does
  :meth:`Simulation.check` require the nodes to agree.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

from mycelia.entity.model import Model
from mycelia.errors import ConnectionClosed, EntityNotFound, MyceliaError
from mycelia.node import Node, Transaction
from mycelia.node.link import ConnectionState
from mycelia.node.transport import Transport
from mycelia.proto import Event, EventId
from mycelia.testing.actions import (
    Action,
    Contend,
    Crash,
    Create,
    Delete,
    Edit,
    FailWrite,
    Intrude,
    Partition,
    Wait,
    literal,
)
from mycelia.testing.acts import act, foreign_events
from mycelia.testing.faults import InjectedFailure
from mycelia.testing.fields import field_kinds
from mycelia.testing.gossip import Replicator
from mycelia.testing.invariants import (
    Unconverged,
    UnexpectedError,
    check_convergence,
    check_heads_are_antichains,
    check_no_dangling_references,
    check_no_lost_commits,
    check_system_membership,
)
from mycelia.testing.links import Links
from mycelia.testing.network import INTRUDER, Faults, Network, VirtualClock
from mycelia.testing.samples import SimLink, SimNote
from mycelia.testing.simnode import SimNode
from mycelia.testing.trace import Trace

__all__ = ["SimConfig", "Simulation"]

QUIESCE_ROUNDS: Final = 12
DRAIN_TICKS: Final = 1_000
QUIET_TICKS: Final = 3
"""Ticks without a frame that count as quiet (more than a round trip once faults are off)."""


@dataclass(frozen=True)
class SimConfig:
    """What to simulate: how many nodes of each kind, how long, which models, which faults."""

    durable: int = 3
    ephemeral: int = 2
    operations: int = 200
    """Actions in a seed's plan."""
    models: tuple[type[Model], ...] = (SimNote, SimLink)
    faults: Faults = field(default_factory=Faults.all)
    gossip_every: int = 8
    """Ticks between gossip rounds (each node sends one digest to one peer)."""
    watch: bool = True
    """Keep live queries open on every node and check them against fetches at the end
    (on a client they are subscriptions on its server, which keep it complete)."""
    narrow: bool = False
    """With ``watch``, every second client watches only a range of each model (see
    :func:`~mycelia.testing.simnode.watch_queries`), so its own commits reach rows its
    subscriptions do not hold; it is not held to being complete. Plans then hold
    :class:`~mycelia.testing.actions.Contend` actions too."""

    @property
    def nodes(self) -> int:
        """Total number of nodes."""
        return self.durable + self.ephemeral

    def __post_init__(self) -> None:
        if self.durable < 1 or self.ephemeral < 0 or not self.models:
            raise ValueError("a simulation needs a durable node and at least one model")

    def describe(self) -> str:
        """Python source that rebuilds this config (models by qualified name)."""
        models = ", ".join(f"{m.__module__}.{m.__qualname__}" for m in self.models)
        return (
            f"SimConfig(durable={self.durable}, ephemeral={self.ephemeral}, "
            f"operations={self.operations}, models=({models},), faults={self.faults!r}, "
            f"gossip_every={self.gossip_every}, watch={self.watch}, narrow={self.narrow})"
        )


class Simulation:
    """Nodes, network, virtual time and the record of what was acknowledged; see above."""

    def __init__(self, config: SimConfig, seed: int, trace: Trace) -> None:
        self.config = config
        self.seed = seed
        self.trace = trace
        self.clock = VirtualClock()
        self.network = Network(
            self.clock, random.Random(f"mycelia-sim/net/{seed}"), config.faults, trace
        )
        self.links = Links(self.network, random.Random(f"mycelia-sim/links/{seed}"), trace)
        self.nodes = [
            SimNode(i, durable=i < config.durable, seed=seed, peers=_peers(i, config))
            for i in range(config.nodes)
        ]
        self.replicator = Replicator(self.nodes, self.network, trace)
        self._gossip_rng = random.Random(f"mycelia-sim/gossip/{seed}")
        self._dial_rng = random.Random(f"mycelia-sim/dial/{seed}")
        self._next_gossip = config.gossip_every
        self.system: list[Event] = []
        self.foreign: list[Event] = []
        self.acknowledged: dict[EventId, tuple[int, int]] = {}
        """Each acknowledged event: (node index, tick)."""
        self.forfeited: set[EventId] = set()
        self._restarts: list[tuple[int, int]] = []
        self._heal_at: int | None = None

    @classmethod
    async def open(cls, config: SimConfig, seed: int, *, trace: Trace | None = None) -> Simulation:
        """Start every node (the first durable one creates the system) and the intruder."""
        sim = cls(config, seed, trace or Trace())
        first = sim.nodes[0]
        node = await sim._start(first)
        await node.create_system()
        sim.system = [e.event for e in await node.system_events()]
        for sn in sim.nodes[1:]:
            await sim._start(sn)
        sim.foreign = await foreign_events(seed, config.models[0])
        sim.trace.record("open", sim.config.describe(), seed, bytes(sim.system[0].id))
        return sim

    # -- actions -----------------------------------------------------------------------

    async def perform(self, action: Action) -> None:
        """Do one action, then let one tick pass."""
        self.trace.record("act", self.clock.now, literal(action))
        if isinstance(action, Create | Edit | Delete):
            await self._commit(action)
        elif isinstance(action, Wait):
            await self.advance(action.ticks - 1)
        elif isinstance(action, Crash):
            await self._crash(self.nodes[action.node], action.down, lose_cache=action.lose_cache)
        elif isinstance(action, Partition):
            self.network.partition(action.side)
            self.links.partitioned()
            self._heal_at = self.clock.now + action.ticks
        elif isinstance(action, FailWrite):
            self._arm(action)
        elif isinstance(action, Intrude):
            self.replicator.push(INTRUDER, action.node, self.foreign)
        elif isinstance(action, Contend):
            await self._contend(action)
        await self.advance(1)

    async def _commit(self, action: Create | Edit | Delete) -> None:
        model = self.config.models[action.model]
        sn = self.nodes[action.node]

        async def body(trx: Transaction) -> bool:
            return await act(trx, sn, model, action)

        await self.transact(action.node, body, label=literal(action))

    async def _contend(self, action: Contend) -> None:
        """The node's edit reads the entity, its rival commits twice, then it commits."""
        model = self.config.models[action.model]
        numeric = [f for f in field_kinds(model) if f.kind in ("int", "float")]
        if not numeric or action.rival == action.node:
            self.trace.record("skip", "no contention")
            return
        name, one = numeric[0].name, 1 if numeric[0].kind == "int" else 1.0
        sn = self.nodes[action.node]

        async def body(trx: Transaction) -> bool:
            alive = sn.alive(model.__collection__)
            if not alive:
                return False
            entity_id = alive[action.pick % len(alive)]
            handle = await trx.edit(model, entity_id)

            async def rival(other: Transaction) -> bool:
                setattr(await other.edit(model, entity_id), name, one)
                return True

            for _ in range(2):  # two generations on: the rival's write wins the merge
                await self.transact(action.rival, rival, label=literal(action))
            setattr(handle, name, -one)
            return True

        await self.transact(action.node, body, label=literal(action))

    async def transact(
        self, index: int, body: Callable[[Transaction], Awaitable[bool]], *, label: str = "?"
    ) -> bool:
        """Run ``body`` in a transaction on node ``index``, then acknowledge and push its
        events to the node's peers. ``body`` returns False when it found nothing to do.

        Returns whether something was committed (False also when the node is down or an
        injected write failure refused the commit). Raises UnexpectedError for any other
        failure.
        """
        sn = self.nodes[index]
        if sn.node is None:
            self.trace.record("skip", "down")
            return False
        sn.take_fresh()
        try:
            async with sn.node.context().transaction() as trx:
                done = await body(trx)
        except EntityNotFound:
            # A client's edit reads through: its server may have had the entity deleted.
            self.trace.record("skip", "gone")
            return False
        except ConnectionClosed:
            # ...and the connection may drop while it does: the read's answer is lost, so
            # the edit fails (ARCHITECTURE.md §7) and nothing was committed.
            self.trace.record("skip", "read-through cut")
            return False
        except InjectedFailure:
            self.replicator.count("commits failed")
            self.trace.record("failed", self.clock.now, sn.index, "commit")
            await self._after_failure(sn)
            return False
        except MyceliaError as exc:
            raise UnexpectedError(f"{label} failed: {exc!r}", node=sn.name) from exc
        events = sn.take_fresh()
        if not done or not events:
            self.trace.record("skip", "nothing to commit")
            return False
        for event in events:
            self.acknowledged[event.id] = (sn.index, self.clock.now)
        self.replicator.count("commits")
        self.trace.record("commit", self.clock.now, sn.index, [bytes(e.id) for e in events])
        if sn.durable:
            self.replicator.broadcast(sn, events)  # a client's commit goes up its connection
        return True

    def _arm(self, action: FailWrite) -> None:
        sn = self.nodes[action.node]
        if sn.up:
            sn.storage.arm()
            sn.crash_after_failure = action.crash

    async def _after_failure(self, sn: SimNode) -> None:
        if sn.crash_after_failure:
            await self._crash(sn, 3, lose_cache=False)

    async def _crash(self, sn: SimNode, down: int, *, lose_cache: bool) -> None:
        if not sn.up:
            return
        if lose_cache and not sn.durable:
            await self._forfeit(sn)
        sn.storage.disarm()
        await sn.crash(self.links, lose_cache=lose_cache)
        self.replicator.count("crashes")
        self.trace.record("crash", self.clock.now, sn.index, lose_cache)
        self._restarts.append((self.clock.now + down, sn.index))

    async def _forfeit(self, sn: SimNode) -> None:
        """Acknowledged commits only this ephemeral node holds are gone with its cache."""
        mine = sorted(i for i, (who, _) in self.acknowledged.items() if who == sn.index)
        others = [o.storage for o in self.nodes if o is not sn]
        for event_id in mine:
            if not any([await storage.event_stored(event_id) for storage in others]):
                self.forfeited.add(event_id)
                self.trace.record("forfeit", self.clock.now, sn.index, bytes(event_id))

    # -- time --------------------------------------------------------------------------

    async def advance(self, ticks: int) -> None:
        """Let ``ticks`` ticks pass: everything due runs (virtual time), then restarts,
        heals, gossip and due gossip deliveries."""
        loop = asyncio.get_running_loop()
        for _ in range(ticks):
            await asyncio.sleep(1)
            now = self.clock.advance(max(1, int(loop.time()) - self.clock.now))
            await self._timers(now)
            if now >= self._next_gossip:
                self._next_gossip = now + self.config.gossip_every
                await self._gossip()
            while (env := self.network.pop_due()) is not None:
                sn = self.nodes[env.dst]
                failed = sn.storage.failed
                await self.replicator.deliver(env)
                if sn.storage.failed != failed:
                    await self._after_failure(sn)

    async def _timers(self, now: int) -> None:
        if self._heal_at is not None and now >= self._heal_at:
            self.network.heal()
            self._heal_at = None
        due = [i for at, i in self._restarts if at <= now]
        self._restarts = [(at, i) for at, i in self._restarts if at > now]
        for index in due:
            await self._restart(self.nodes[index])

    async def _start(self, sn: SimNode) -> Node:
        """Open the node; a client then keeps a connection to a durable node."""
        narrow = self._narrow(sn)
        node = await sn.start(
            self.system, self.config.models, watch=self.config.watch, narrow=narrow
        )
        if not sn.durable:
            sn.connect(self._dial)
        return node

    def _narrow(self, sn: SimNode) -> bool:
        """Whether ``sn`` watches only a range of each model (see :class:`SimConfig`)."""
        return self.config.narrow and not sn.durable and sn.index % 2 == 1

    def _dial(self, client: SimNode) -> Transport:
        """A stream from ``client`` to one durable node it can reach (the run's choice)."""
        reachable = [
            sn
            for sn in self.nodes
            if sn.durable and sn.up and not self.network.cut(client.index, sn.index)
        ]
        if not reachable:
            self.links.count("dials refused")
            raise ConnectionRefusedError(f"{client.name} can reach no durable node")
        server = reachable[self._dial_rng.randrange(len(reachable))]
        self.trace.record("dial", self.clock.now, client.index, server.index)
        return server.serve(self.links, client.index)

    async def _restart(self, sn: SimNode) -> None:
        if sn.up:
            return
        await self._start(sn)
        self.replicator.count("restarts")
        self.trace.record("restart", self.clock.now, sn.index, sn.incarnation)
        for peer in sn.peers:
            await self.replicator.digest(sn, peer)

    async def _gossip(self) -> None:
        for sn in self.nodes:
            if sn.up and sn.peers:
                peer = sn.peers[self._gossip_rng.randrange(len(sn.peers))]
                await self.replicator.digest(sn, peer)

    # -- the end -----------------------------------------------------------------------

    async def quiesce(self) -> None:
        """Turn faults off, heal, restart everyone; let every client reconnect and push what
        it owes; gossip until a round stores nothing and moves no frame.

        Raises Unconverged if that takes more than a bounded number of rounds.
        """
        self.trace.record("quiesce", self.clock.now)
        self.network.faults = Faults.none()
        self.network.heal()
        self._heal_at = None
        for sn in self.nodes:
            sn.storage.disarm()
            sn.crash_after_failure = False
        for _, index in sorted(self._restarts):
            await self._restart(self.nodes[index])
        self._restarts = []
        for _ in range(QUIESCE_ROUNDS):
            before = (self.replicator.stored, self.links.counts.get("frames", 0))
            for sn in self.nodes:
                for peer in sn.peers:
                    await self.replicator.digest(sn, peer)
            await self._drain()
            if (self.replicator.stored, self.links.counts.get("frames", 0)) == before:
                return
        raise Unconverged(f"still storing or sending after {QUIESCE_ROUNDS} quiet rounds")

    async def _drain(self) -> None:
        """Run until nothing is in flight, no frame moved for a few ticks (a client may be
        between a response and its next request) and every client is ready and owes
        nothing (bounded: endless traffic is a failure)."""
        quiet = 0
        for _ in range(DRAIN_TICKS):
            frames = self.links.counts.get("frames", 0)
            await self.advance(1)
            idle = not (self.network.in_flight or self.links.in_flight)
            if idle and frames == self.links.counts.get("frames", 0):
                quiet += 1
            else:
                quiet = 0
            if quiet >= QUIET_TICKS and all(_settled(sn) for sn in self.nodes if not sn.durable):
                return
        stuck = [sn.name for sn in self.nodes if not sn.durable and not _settled(sn)]
        raise Unconverged(f"still busy after {DRAIN_TICKS} ticks (clients not settled: {stuck})")

    async def check(self) -> None:
        """Every invariant of :mod:`mycelia.testing.invariants`, on every node.

        With live queries watched, a client is kept complete by its subscriptions and must
        hold what the durable nodes hold (but entities deleted before it saw them);
        without, it only holds what it touched, which must agree replica by replica.
        """
        nodes = {sn.name: sn.node for sn in self.nodes if sn.node is not None}
        durable = {sn.name: sn.node for sn in self.nodes if sn.node is not None and sn.durable}
        await check_heads_are_antichains(nodes)
        await check_no_dangling_references(nodes)
        await check_system_membership(nodes)
        full = {
            sn.name: sn.node for sn in self.nodes if sn.node is not None and not self._narrow(sn)
        }
        if len(full) < len(nodes):
            await check_convergence(nodes)  # (a narrow client holds what it touched)
        await check_convergence(full, complete=self.config.watch)
        await check_convergence(durable, complete=True)
        kept = {
            i: f"committed by {self.nodes[who].name} at tick {tick}"
            for i, (who, tick) in self.acknowledged.items()
            if i not in self.forfeited
        }
        await check_no_lost_commits(nodes, kept)
        for sn in self.nodes:
            for watched in sn.watched:
                await watched.check(sn.name)
        await self._record_final()

    async def _record_final(self) -> None:
        for sn in self.nodes:
            states = await sn.storage.get_states(sorted(sn.known))
            for entity_id in sorted(states):
                state = states[entity_id].state
                self.trace.record("final", sn.index, bytes(entity_id), list(state.buffers))

    def stats(self) -> dict[str, int]:
        """Counters of what happened (commits, messages, faults...)."""
        out = dict(self.replicator.counts)
        out.update(self.network.counts)
        out.update(self.links.counts)
        out["acknowledged"] = len(self.acknowledged)
        out["forfeited"] = len(self.forfeited)
        out["ticks"] = self.clock.now
        return dict(sorted(out.items()))


def _peers(index: int, config: SimConfig) -> tuple[int, ...]:
    """Durable nodes gossip with each other; clients (ephemeral) reach them by connection."""
    if index < config.durable:
        return tuple(i for i in range(config.durable) if i != index)
    return ()


def _settled(sn: SimNode) -> bool:
    """Whether a client is up, connected and ready, and owes nothing."""
    return (
        sn.node is not None
        and sn.connection is not None
        and sn.connection.state is ConnectionState.READY
        and not sn.node.owed()
    )
