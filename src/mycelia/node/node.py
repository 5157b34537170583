"""``Node``: the composition root that wires storage, applier, policy and peers.

A node is **durable** (keeps every event it accepts; creates the system root) or
**ephemeral** (a cache that may hold state snapshots without their events). It does no
merging itself: the applier does; it owns the parts and their lifetimes
(ARCHITECTURE.md §7, STYLE.md §9).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Generator, Iterable
from types import TracebackType
from typing import Final

from mycelia.entity import (
    Applier,
    EntityChange,
    EventCheck,
    IngestResult,
    PendingPool,
    Residents,
)
from mycelia.entity.backends import ClientIds
from mycelia.errors import ForeignSystem, InvalidArgument, InvalidEvent, LocalProtocolError
from mycelia.node.context import Context
from mycelia.node.policy import LOCAL, Credentials, PermissiveAgent, PolicyAgent
from mycelia.proto import (
    DEFAULT_LIMITS,
    SYSTEM_COLLECTION,
    AdmittedEvent,
    EntityId,
    Event,
    Limits,
)
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
    ) -> None:
        self.storage = storage
        self.durable = durable
        self.policy = policy
        self.limits = limits
        self._root = root
        self.residents = Residents()
        self.text_ids = ClientIds()
        self.applier = Applier(
            storage,
            self.residents,
            durable=durable,
            system_root=lambda: self._root,
            pending=PendingPool(),
        )
        self._listeners: list[ChangeListener] = []
        self._closed = False

    @classmethod
    def open(
        cls,
        storage: StorageEngine,
        *,
        durable: bool,
        policy: PolicyAgent | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ) -> _Opening:
        """Open a node on ``storage``: ``node = await Node.open(...)`` or ``async with``."""
        return _Opening(cls._open(storage, durable=durable, policy=policy, limits=limits))

    @classmethod
    async def _open(
        cls,
        storage: StorageEngine,
        *,
        durable: bool,
        policy: PolicyAgent | None,
        limits: Limits,
    ) -> Node:
        raw = await storage.get_meta(ROOT_KEY)
        root = EntityId(raw) if raw is not None else None
        return cls(
            storage, durable=durable, policy=policy or PermissiveAgent(), limits=limits, root=root
        )

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
            collection=SYSTEM_COLLECTION, system=None, operations={}, limits=self.limits
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
        self._notify(result.changes)
        result.raise_first()
        return result

    async def commit_local(self, events: list[Event], *, check: EventCheck) -> IngestResult:
        """Commit a transaction's events atomically; ``check`` runs before anything is durable."""
        result = await self.applier.ingest(events, atomic=True, check=check)
        self._notify(result.changes)
        return result

    def _notify(self, changes: list[EntityChange]) -> None:
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
