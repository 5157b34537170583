"""``Node``: the composition root that wires storage, applier, policy and peers.

A node is **durable** (keeps every event it accepts; creates the system root) or
**ephemeral** (a cache that may hold state snapshots without their events, commits
locally first and owes its commits to a durable peer). It merges nothing itself and
exposes none of its parts: it builds them, wires each to the narrow ports of
:mod:`mycelia.node.ports` it needs, and owns their lifetimes (ARCHITECTURE.md §7,
STYLE.md §9)::

    storage ── applier ──┬── commits (LocalCommits | CommitPipeline + Outbox)
                         ├── upstream (Link) ── Connection ── PeerConnection
                         ├── responder ── PeerConnection (served peers)
                         └── reactor ── live queries
    contexts ── transactions, get/fetch (through the upstream), live queries (reactor)

The parts are built and wired by the constructor, which ``Node`` takes from its base
:class:`~mycelia.node.wiring.Wiring`; this module holds what a node does: opening, the
system root, contexts, ingesting, peers and closing.
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Final

from mycelia.entity import IngestResult
from mycelia.errors import ForeignSystem, InvalidArgument, InvalidEvent, LocalProtocolError
from mycelia.node.budget import DEFAULT_BOUNDS, Bounds
from mycelia.node.client import Connection, ConnectionState, Dialer
from mycelia.node.commits import Rejection
from mycelia.node.context import Context
from mycelia.node.feed import follows
from mycelia.node.identity import KEY_META, NodeKey
from mycelia.node.peer import PeerConnection
from mycelia.node.policy import LOCAL, Credentials, PermissiveAgent, PolicyAgent
from mycelia.node.ports import ChangeListener
from mycelia.node.transport import Transport
from mycelia.node.wiring import Wiring
from mycelia.proto import (
    DEFAULT_LIMITS,
    SYSTEM_COLLECTION,
    AdmittedEvent,
    EntityId,
    EntityState,
    Event,
    Limits,
    NodeId,
)
from mycelia.proto.event import NONCE_LENGTH
from mycelia.retrieval import WriteBatch
from mycelia.storage import StorageEngine
from mycelia.storage.meta import SYSTEM_ROOT

__all__ = ["ChangeListener", "Node", "NodeStats"]

log = logging.getLogger(__name__)

ROOT_KEY: Final = SYSTEM_ROOT


@dataclass(frozen=True, slots=True)
class NodeStats:
    """What a node holds and does now (for operators, metrics and tests)."""

    live_queries: int
    """Live queries open on this node."""
    subscriptions: int
    """Standing queries this node serves to its peers."""
    owed_commits: int
    """Local commits not yet confirmed by the durable peer (ephemeral nodes)."""
    held_events: int
    """Events waiting for parents this node does not hold yet."""
    residents: int
    """Entities held in memory."""


class Node(Wiring):
    """A Mycelia node; open one with :meth:`open`."""

    @classmethod
    def open(
        cls,
        storage: StorageEngine,
        *,
        durable: bool,
        policy: PolicyAgent | None = None,
        limits: Limits = DEFAULT_LIMITS,
        rng: random.Random | None = None,
        progress: bool = True,
        key: NodeKey | None = None,
    ) -> _Opening:
        """Open a node on ``storage``: ``node = await Node.open(...)`` or ``async with``.

        ``rng`` makes the node's entropy (genesis nonces, text client ids, a new node key)
        deterministic — for simulations and tests only: production nodes draw from
        ``secrets``. ``progress``: a client's sync that takes over a second (preparing a
        session, a live query's first result) shows a bar while stderr is a terminal
        (``False``: never); it is logged at INFO every few seconds either way. ``key``: the
        node's key from elsewhere (a server that keeps nothing on its disk); by default it
        is the one kept in ``storage``, made on first open.
        """
        opening = cls._open(
            storage,
            durable=durable,
            policy=policy,
            limits=limits,
            rng=rng,
            progress=progress,
            key=key,
        )
        return _Opening(opening)

    @classmethod
    async def _open(
        cls,
        storage: StorageEngine,
        *,
        durable: bool,
        policy: PolicyAgent | None,
        limits: Limits,
        rng: random.Random | None,
        progress: bool,
        key: NodeKey | None,
    ) -> Node:
        offset = await storage.last_offset() if follows(storage) else 0  # feed followed from here
        raw = await storage.get_meta(ROOT_KEY)
        root = EntityId(raw) if raw is not None else None
        if key is None:
            key = await _stored_key(storage, rng)
        node = cls(
            storage,
            durable=durable,
            policy=policy or PermissiveAgent(),
            limits=limits,
            root=root,
            key=key,
            rng=rng,
            progress=progress,
        )
        if node._pipeline is not None:
            await node._pipeline.load()
        if node._feed is not None:
            node._spawn(node._feed.run(offset))
        return node

    # -- what a node is ------------------------------------------------------------------

    @property
    def node_id(self) -> NodeId:
        """This node's id: its Ed25519 public key."""
        return self._key.node_id

    @property
    def durable(self) -> bool:
        """Whether this node keeps every event it accepts (else it is a cache)."""
        return self._durable

    @property
    def storage(self) -> StorageEngine:
        """The storage engine the node was opened on."""
        return self._storage

    @property
    def policy(self) -> PolicyAgent:
        """The policy agent the node was opened with."""
        return self._policy

    @property
    def limits(self) -> Limits:
        """The decode limits this node enforces on what it receives."""
        return self._limits

    @property
    def system_root(self) -> EntityId | None:
        """The id of this node's system root, once it has one."""
        return self._root

    def stats(self) -> NodeStats:
        """Counts of what the node holds and does now."""
        self._check_open()
        return NodeStats(
            live_queries=self._reactor.count(),
            subscriptions=self._responder.subscription_count(),
            owed_commits=0 if self._pipeline is None else self._pipeline.owed_count(),
            held_events=len(self._applier.pending),
            residents=len(self._residents),
        )

    def resident_state(self, entity_id: EntityId) -> EntityState | None:
        """The entity's state as held in memory now (``None`` if it is not resident, or a
        run is changing it): for invariant checkers, which compare it with storage. Memory
        is never ahead of storage once a run is over; during one it leads until the run's
        write (a failed run evicts the entity), so such an entity is not shown."""
        if entity_id in self._applier.locks:
            return None
        entity = self._residents.get(entity_id)
        return None if entity is None or not entity.exists else entity.to_state()

    # -- using it ------------------------------------------------------------------------

    def context(self, credentials: Credentials | None = None) -> Context:
        """A context acting with ``credentials`` (default: local, trusted)."""
        self._check_open()
        return Context(self._parts, credentials or LOCAL)

    def on_change(self, listener: ChangeListener, *, everything: bool = True) -> Callable[[], None]:
        """Call ``listener`` after every commit that changes entities; returns a remover.

        On a store other processes write too (PostgreSQL), their commits are heard from
        its change feed. ``everything=False``: only those this node shows anyway (its own
        commits, and the others' in the collections its live queries and served
        subscriptions read), so the listener does not make it read every commit of the
        cluster (a server's metrics and logs).
        """
        self._check_open()
        self._listeners.append(listener)
        self._hearing_all += everything

        def remove() -> None:
            self._listeners.remove(listener)
            self._hearing_all -= everything

        return remove

    def rejections(self) -> AsyncIterator[Rejection]:
        """Every local commit reverted from now on, because the durable peer refused it or
        one it was built on (an async iterator of :class:`Rejection`; empty on a durable
        node, which has no durable peer to refuse anything)."""
        self._check_open()
        if self._pipeline is None:
            return _nothing()
        return self._pipeline.rejections()

    def owed(self) -> list[Event]:
        """The events of every local commit the durable peer has not confirmed yet."""
        self._check_open()
        return [] if self._pipeline is None else self._pipeline.owed()

    async def create_system(self) -> EntityId:
        """Create the system root (durable nodes only; idempotent). Returns its id."""
        self._check_open()
        if not self._durable:
            raise LocalProtocolError(
                "only a durable node creates a system: a client joins its server's system "
                "when it first connects, or offline with join_system(events), given the "
                "system's root events (the server's system_events(), shipped with the app)"
            )
        if self._root is not None:
            return self._root
        genesis = Event.genesis(
            collection=SYSTEM_COLLECTION,
            system=None,
            operations={},
            nonce=self._entropy(NONCE_LENGTH),
            limits=self._limits,
        )
        self._root = genesis.entity_id
        try:
            await self._applier.ingest(
                [genesis], atomic=True, meta=((ROOT_KEY, bytes(genesis.entity_id)),)
            )
        except BaseException:
            self._root = None
            raise
        log.info("created system %s", genesis.entity_id)
        return genesis.entity_id

    async def system_events(self) -> list[AdmittedEvent]:
        """The events that define this node's system (give them to ``join_system``)."""
        self._check_open()
        if self._root is None:
            return []
        return await self._storage.events_of(self._root)

    async def join_system(self, events: Iterable[Event | AdmittedEvent]) -> None:
        """Adopt the system defined by ``events`` (from another node's ``system_events``).

        Raises ForeignSystem if this node already belongs to another system, and
        InvalidEvent if ``events`` hold no system root.
        """
        self._check_open()
        batch = [e.event if isinstance(e, AdmittedEvent) else e for e in events]
        roots = [e for e in batch if e.is_genesis and e.system is None]
        if len(roots) != 1 or roots[0].collection != SYSTEM_COLLECTION:
            raise InvalidEvent("system events must hold exactly one root genesis")
        root = roots[0].entity_id
        if self._root is not None and self._root != root:
            raise ForeignSystem(f"this node belongs to system {self._root}, not {root}")
        if any(e.entity_id != root for e in batch):
            raise InvalidEvent("system events may only belong to the root entity")
        previous = self._root
        self._root = root
        try:
            await self._applier.ingest(batch, atomic=True, meta=((ROOT_KEY, bytes(root)),))
        except BaseException:
            self._root = previous
            raise

    async def ingest(self, events: Iterable[Event | AdmittedEvent]) -> IngestResult:
        """Apply events from elsewhere, in any order, any number of times.

        Events whose parents are unknown are held until they arrive (see the result's
        ``missing``). Raises the first error if some entity's events were refused (the
        other entities' events are applied).
        """
        self._check_open()
        batch = [e.event if isinstance(e, AdmittedEvent) else e for e in events]
        if len(batch) > self._limits.max_batch_events * 100:
            raise InvalidArgument("ingest at most 100 batches' worth of events at a time")
        result = await self._applier.ingest(batch)
        result.raise_first()
        return result

    async def ingest_states(self, states: Iterable[EntityState]) -> IngestResult:
        """Merge entity states from elsewhere (a durable peer's snapshots): every backend is
        a state CRDT, so any order converges. Raises the first error (DecodeError,
        InvalidEvent) if some state did not fit; the others are merged."""
        self._check_open()
        result = await self._applier.ingest_states(list(states))
        result.raise_first()
        return result

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until this node's durable peer connection is ready (no-op without one).

        Raises ConnectTimeout (a TimeoutError naming the state and the last cause),
        PolicyDenied or ForeignSystem (refused for good), ConnectionClosed; see
        :meth:`mycelia.Connection.wait_ready`.
        """
        self._check_open()
        if self._connection is not None:
            await self._connection.wait_ready(timeout)

    # -- peers (``mycelia.connect`` and ``mycelia.serve`` call these) -----------------------

    def attach(
        self,
        dial: Dialer,
        *,
        token: bytes | None,
        min_backoff: float,
        max_backoff: float,
        request_timeout: float,
        rng: random.Random,
    ) -> Connection:
        """Reach this node's durable peer through ``dial`` from now on (``connect`` calls
        this). Raises LocalProtocolError if the node has a connection that is not CLOSED
        (one that was closed, or refused for good, is replaced), InvalidArgument for a
        token that is not bytes."""
        self._check_open()
        if token is not None and not isinstance(token, bytes):
            raise InvalidArgument(
                f"the token is a {type(token).__name__}, not bytes: pass the bytes "
                "TokenIssuer.issue returned, or decode the text 'mycelia token issue' prints "
                "with mycelia.node.tokens.decode_token(text)"
            )
        previous = self._connection
        if previous is not None:
            if previous.state is not ConnectionState.CLOSED:
                raise LocalProtocolError(
                    "this node is connected already: close that connection first"
                )
            previous.retire()
            self._link.reopen()

        self._connection = Connection(
            dial,
            link=self._link,
            open_session=partial(
                self._dialed_session, token=token, request_timeout=request_timeout
            ),
            prepare=self._upstream.prepare,
            finish=self._upstream.stopped,
            min_backoff=min_backoff,
            max_backoff=max_backoff,
            rng=rng,
            slow=self._slow,
        )
        return self._connection

    def accept(
        self,
        transport: Transport,
        *,
        request_timeout: float,
        handshake_timeout: float,
        outgoing_frames: int,
        bounds: Bounds = DEFAULT_BOUNDS,
    ) -> PeerConnection:
        """A connection for a peer that dialed in over ``transport`` (``serve`` calls this;
        drive it with ``await peer.run()``)."""
        self._check_open()
        return self._session(
            transport,
            dialed=False,
            request_timeout=request_timeout,
            handshake_timeout=handshake_timeout,
            outgoing_frames=outgoing_frames,
            bounds=bounds,
        )

    async def close(self) -> None:
        """Close the node and its storage (idempotent). Open live queries end; every later
        call on the node, its contexts, transactions and live queries raises NodeClosed."""
        if self._closed:
            return
        self._closed = True
        for live in list(self._parts.live.opened):
            live.end()
        try:
            if self._connection is not None:
                await self._connection.close()
        finally:  # a close that is cancelled still lets go of the storage, then re-raises
            for task in list(self._tasks):
                task.cancel()
            await self._storage.close()
            self._residents.clear()  # (freed now: the node's parts hold one another in cycles)

    async def __aenter__(self) -> Node:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


async def _stored_key(storage: StorageEngine, rng: random.Random | None) -> NodeKey:
    """The node key kept in ``storage``, made and stored on first open."""
    stored_key = await storage.get_meta(KEY_META)
    if stored_key is not None:
        return NodeKey.from_private_bytes(stored_key)
    key = NodeKey.generate() if rng is None else NodeKey.from_private_bytes(rng.randbytes(32))
    await storage.write(WriteBatch(meta=((KEY_META, key.private_bytes()),)))
    return key


async def _nothing() -> AsyncIterator[Rejection]:
    """An async iterator that ends at once."""
    nothing: tuple[Rejection, ...] = ()
    for rejection in nothing:
        yield rejection


class _Opening:
    """What :meth:`Node.open` returns: await it, or use it with ``async with``."""

    def __init__(self, opening: Awaitable[Node]) -> None:
        self._opening = opening
        self._node: Node | None = None

    def __await__(self) -> Generator[object, None, Node]:
        return self._opening.__await__()

    async def __aenter__(self) -> Node:
        self._node = await self._opening
        return self._node

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._node is not None:
            await self._node.close()
