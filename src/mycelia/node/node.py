"""``Node``: the composition root that wires storage, applier, policy and peers.

A node is **durable** (keeps every event it accepts; creates the system root) or
**ephemeral** (a cache that may hold state snapshots without their events). It does no
merging itself: the applier does; it owns the parts and their lifetimes
(ARCHITECTURE.md §7, STYLE.md §9).
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable, Sequence
from types import TracebackType
from typing import Final

from mycelia import errors
from mycelia.entity import (
    Applier,
    EntityChange,
    EventCheck,
    IngestResult,
    PendingPool,
    Residents,
)
from mycelia.entity.backends import ClientIds
from mycelia.errors import (
    ConnectionClosed,
    ForeignSystem,
    InvalidArgument,
    InvalidEvent,
    LocalProtocolError,
    MyceliaError,
    RemoteError,
    RequestTimeout,
)
from mycelia.node.client import Connection, ConnectionState
from mycelia.node.context import Context
from mycelia.node.identity import KEY_META, NodeKey
from mycelia.node.live import Reactor
from mycelia.node.outbox import Outbox
from mycelia.node.policy import LOCAL, Credentials, PermissiveAgent, PolicyAgent
from mycelia.node.serving import Responder
from mycelia.proto import (
    DEFAULT_LIMITS,
    SYSTEM_COLLECTION,
    AdmittedEvent,
    EntityId,
    Event,
    EventId,
    Limits,
    NodeId,
)
from mycelia.proto.event import NONCE_LENGTH
from mycelia.proto.peering import CommitRequest, EventsResponse, GetEventsRequest
from mycelia.retrieval import WriteBatch
from mycelia.storage import StorageEngine

__all__ = ["ChangeListener", "Node"]

log = logging.getLogger(__name__)

ROOT_KEY: Final = "system_root"

ChangeListener = Callable[[list[EntityChange]], None]
"""Called synchronously after every commit that changed entities."""


class Node:
    """A Mycelia node; open one with :meth:`open`."""

    def __init__(
        self,
        storage: StorageEngine,
        *,
        durable: bool,
        policy: PolicyAgent,
        limits: Limits,
        root: EntityId | None,
        key: NodeKey,
        rng: random.Random | None = None,
    ) -> None:
        self.storage = storage
        self.key = key
        self._rng = rng
        self.durable = durable
        self.policy = policy
        self.limits = limits
        self._root = root
        self.residents = Residents()
        self.text_ids = ClientIds(rng)
        self.applier = Applier(
            storage,
            self.residents,
            durable=durable,
            system_root=lambda: self._root,
            pending=PendingPool(),
        )
        self._listeners: list[ChangeListener] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.outbox = Outbox(storage)
        self.upstream: Connection | None = None
        self.responder = Responder(self)
        self.reactor = Reactor(self)

    @classmethod
    def open(
        cls,
        storage: StorageEngine,
        *,
        durable: bool,
        policy: PolicyAgent | None = None,
        limits: Limits = DEFAULT_LIMITS,
        rng: random.Random | None = None,
    ) -> _Opening:
        """Open a node on ``storage``: ``node = await Node.open(...)`` or ``async with``.

        ``rng`` makes the node's entropy (genesis nonces, text client ids, a new node key)
        deterministic — for simulations and tests only: production nodes draw from
        ``secrets``.
        """
        return _Opening(cls._open(storage, durable=durable, policy=policy, limits=limits, rng=rng))

    @classmethod
    async def _open(
        cls,
        storage: StorageEngine,
        *,
        durable: bool,
        policy: PolicyAgent | None,
        limits: Limits,
        rng: random.Random | None,
    ) -> Node:
        raw = await storage.get_meta(ROOT_KEY)
        root = EntityId(raw) if raw is not None else None
        stored_key = await storage.get_meta(KEY_META)
        if stored_key is None:
            key = (
                NodeKey.generate() if rng is None else NodeKey.from_private_bytes(rng.randbytes(32))
            )
            await storage.write(WriteBatch(meta=((KEY_META, key.private_bytes()),)))
        else:
            key = NodeKey.from_private_bytes(stored_key)
        return cls(
            storage,
            durable=durable,
            policy=policy or PermissiveAgent(),
            limits=limits,
            root=root,
            key=key,
            rng=rng,
        )

    def entropy(self, size: int) -> bytes:
        """``size`` random bytes (from the injected ``rng`` if the node was given one)."""
        return secrets.token_bytes(size) if self._rng is None else self._rng.randbytes(size)

    @property
    def node_id(self) -> NodeId:
        """This node's id: its Ed25519 public key."""
        return self.key.node_id

    @property
    def system_root(self) -> EntityId | None:
        """The id of this node's system root, once it has one."""
        return self._root

    def context(self, credentials: Credentials | None = None) -> Context:
        """A context acting with ``credentials`` (default: local, trusted)."""
        return Context(self, credentials or LOCAL)

    def on_change(self, listener: ChangeListener) -> Callable[[], None]:
        """Call ``listener`` after every commit that changes entities; returns a remover."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    async def create_system(self) -> EntityId:
        """Create the system root (durable nodes only; idempotent). Returns its id."""
        if not self.durable:
            raise LocalProtocolError("only a durable node creates a system; join one instead")
        if self._root is not None:
            return self._root
        genesis = Event.genesis(
            collection=SYSTEM_COLLECTION,
            system=None,
            operations={},
            nonce=self.entropy(NONCE_LENGTH),
            limits=self.limits,
        )
        self._root = genesis.entity_id
        try:
            await self.applier.ingest(
                [genesis], atomic=True, meta=((ROOT_KEY, bytes(genesis.entity_id)),)
            )
        except BaseException:
            self._root = None
            raise
        log.info("created system %s", genesis.entity_id)
        return genesis.entity_id

    async def system_events(self) -> list[AdmittedEvent]:
        """The events that define this node's system (give them to ``join_system``)."""
        if self._root is None:
            return []
        return await self.storage.events_of(self._root)

    async def join_system(self, events: Iterable[Event | AdmittedEvent]) -> None:
        """Adopt the system defined by ``events`` (from another node's ``system_events``).

        Raises ForeignSystem if this node already belongs to another system, and
        InvalidEvent if ``events`` hold no system root.
        """
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
            await self.applier.ingest(batch, atomic=True, meta=((ROOT_KEY, bytes(root)),))
        except BaseException:
            self._root = previous
            raise

    async def ingest(self, events: Iterable[Event | AdmittedEvent]) -> IngestResult:
        """Apply events from elsewhere, in any order, any number of times.

        Events whose parents are unknown are held until they arrive (see the result's
        ``missing``). Raises the first error if some entity's events were refused (the
        other entities' events are applied).
        """
        batch = [e.event if isinstance(e, AdmittedEvent) else e for e in events]
        if len(batch) > self.limits.max_batch_events * 100:
            raise InvalidArgument("ingest at most 100 batches' worth of events at a time")
        result = await self.applier.ingest(batch)
        self.notify(result.changes)
        result.raise_first()
        return result

    async def commit_local(self, events: list[Event], *, check: EventCheck) -> IngestResult:
        """Commit a transaction's events atomically; ``check`` runs before anything is durable.

        A durable node commits here. An ephemeral node checks locally first, then commits
        on its durable peer when connected (a refusal there persists nothing anywhere), then
        here; with no peer reachable the commit is durable here and owed (the outbox).
        """
        if self.durable:
            result = await self.applier.ingest(events, atomic=True, check=check)
        else:
            result = await self._commit_ephemeral(events, check)
        self.notify(result.changes)
        return result

    async def _commit_ephemeral(self, events: list[Event], check: EventCheck) -> IngestResult:
        if not isinstance(self.policy, PermissiveAgent):
            # Check locally before the server sees anything (a permissive agent allows all).
            await self.applier.ingest(events, atomic=True, check=check, dry_run=True)
        upstream = self.upstream
        if upstream is not None and upstream.state is ConnectionState.READY:
            try:
                await upstream.request(lambda rid: CommitRequest(rid, tuple(events)))
            except RemoteError as exc:
                raise _local_error(exc) from exc
            except (ConnectionClosed, RequestTimeout):
                log.info("server unreachable during a commit: keeping it owed")
            else:
                return await self.applier.ingest(events, atomic=True, check=check)
        async with self.outbox.lock:
            record = await self.outbox.owe(events)
            result = await self.applier.ingest(events, atomic=True, check=check, meta=record)
            self.outbox.committed(record)
        return result

    async def commit_remote(self, events: list[Event], *, check: EventCheck) -> IngestResult:
        """Commit events a peer sent (all-or-nothing; ``check`` runs before durability)."""
        result = await self.applier.ingest(events, atomic=True, check=check)
        self.notify(result.changes)
        return result

    def spawn(self, coro: Coroutine[object, object, None]) -> None:
        """Run ``coro`` as a task the node keeps (errors are logged, not lost)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a node task failed", exc_info=task.exception())

    def attach_upstream(self, connection: Connection) -> None:
        """Use ``connection`` as this node's durable peer (``connect`` calls this).

        An ephemeral node then asks it for history it does not hold while placing events
        or merging snapshots (the cached getter of ARCHITECTURE.md §4).
        """
        self.upstream = connection
        if not self.durable:
            self.applier.remote = self._remote_events

    async def _remote_events(self, ids: Sequence[EventId], ahead: int) -> list[AdmittedEvent]:
        """Events from the durable peer (nothing when it is unreachable or refuses)."""
        upstream = self.upstream
        if upstream is None or upstream.state is not ConnectionState.READY:
            return []
        wanted = tuple(ids)
        try:
            response = await upstream.request(lambda rid: GetEventsRequest(rid, wanted, ahead))
        except (ConnectionClosed, RequestTimeout, RemoteError) as exc:
            log.info("could not fetch %d events from the server: %s", len(wanted), exc)
            return []
        assert isinstance(response, EventsResponse)
        if len(response.generations) != len(response.events):
            return []
        return [
            AdmittedEvent(e, g) for e, g in zip(response.events, response.generations, strict=True)
        ]

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until this node's durable peer connection is ready (no-op without one)."""
        if self.upstream is not None:
            await self.upstream.wait_ready(timeout)

    def notify(self, changes: list[EntityChange]) -> None:
        """Tell every change listener about ``changes`` (no-op for an empty list)."""
        if not changes:
            return
        for listener in list(self._listeners):
            try:
                listener(changes)
            except Exception:  # a broken listener must not break commits
                log.exception("a change listener failed")

    async def close(self) -> None:
        """Close the node and its storage."""
        if self._closed:
            return
        self._closed = True
        if self.upstream is not None:
            await self.upstream.close()
        await self.storage.close()

    async def __aenter__(self) -> Node:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


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


def _local_error(exc: RemoteError) -> MyceliaError:
    """The local error class a peer's refusal names (PolicyDenied stays PolicyDenied)."""
    kind = getattr(errors, exc.kind, None)
    if isinstance(kind, type) and issubclass(kind, MyceliaError) and kind is not RemoteError:
        try:
            return kind(f"the server refused: {exc}")
        except TypeError:
            pass
    return exc
