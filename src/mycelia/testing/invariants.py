"""Invariant checkers for replicated nodes, usable in any test (ARCHITECTURE.md §1, §12).

Each checker is an ``async`` function over nodes (a sequence, or a mapping from the names
you want in messages to nodes) and raises an :class:`InvariantViolation` subclass naming
the node, the entity and the difference:

======================================  ==========================================================
:func:`check_convergence`               replicas at the same head of an entity, and durable ones
                                        holding the same events, hold the same state buffers
                                        byte for byte, and memory
                                        matches storage (:class:`Divergence`,
                                        :class:`MemoryAhead`); with ``complete=True`` (after
                                        healing and quiescence) every node holds the same state
                                        and every durable node the same events
                                        (:class:`Unconverged`)
:func:`check_no_lost_commits`           every acknowledged commit is stored on every durable
                                        node (:class:`LostCommit`)
:func:`check_heads_are_antichains`      no head tip is an ancestor of another
                                        (:class:`HeadNotAntichain`)
:func:`check_no_dangling_references`    on durable nodes, every head id is a stored event and
                                        every stored event's parents are stored
                                        (:class:`DanglingReference`)
:func:`check_system_membership`         every entity's genesis binds the node's system root
                                        (:class:`ForeignEntity`)
:class:`WatchedQuery`                   a live query's items, and the state its change stream
                                        adds up to, equal a fresh fetch
                                        (:class:`LiveQueryMismatch`)
======================================  ==========================================================

Checkers read through the public storage protocol and the node's resident set; they never
change anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from mycelia.entity import Entity
from mycelia.entity.model import Model
from mycelia.node import Context, Node
from mycelia.node.live import LiveQuery
from mycelia.proto import Clock, EntityId, EntityState, EventId
from mycelia.storage import StorageEngine
from mycelia.testing.dags import ancestry

__all__ = [
    "DanglingReference",
    "Divergence",
    "ForeignEntity",
    "HeadNotAntichain",
    "InvariantViolation",
    "LiveQueryMismatch",
    "LostCommit",
    "MemoryAhead",
    "Nodes",
    "Unconverged",
    "UnexpectedError",
    "WatchedQuery",
    "check_convergence",
    "check_heads_are_antichains",
    "check_no_dangling_references",
    "check_no_lost_commits",
    "check_system_membership",
    "stored_entities",
]

M = TypeVar("M", bound=Model)

Nodes = Mapping[str, Node] | Sequence[Node]
"""Nodes to check: a sequence (named ``node 0``, ``node 1``...) or a name → node mapping."""


class InvariantViolation(AssertionError):
    """An invariant does not hold; ``node`` and ``entity`` say where."""

    def __init__(
        self, message: str, *, node: str | None = None, entity: EntityId | None = None
    ) -> None:
        where = " ".join(
            part
            for part in (
                f"[{type(self).__name__}]",
                f"node {node}:" if node is not None else "",
                f"entity {entity}:" if entity is not None else "",
            )
            if part
        )
        super().__init__(f"{where} {message}")
        self.node = node
        self.entity = entity


class Divergence(InvariantViolation):
    """Two replicas at the same head of an entity (or durable ones holding the same events
    of it) hold different states."""


class Unconverged(InvariantViolation):
    """After healing and quiescence, replicas still hold different events or states."""


class MemoryAhead(InvariantViolation):
    """A node's in-memory entity differs from what its storage holds."""


class LostCommit(InvariantViolation):
    """An acknowledged commit is missing from a durable node."""


class HeadNotAntichain(InvariantViolation):
    """One tip of a head is an ancestor of another."""


class DanglingReference(InvariantViolation):
    """A durable node's state or event references an event it does not store."""


class ForeignEntity(InvariantViolation):
    """An entity appears in a system it was not created in."""


class LiveQueryMismatch(InvariantViolation):
    """A live query's result differs from a fresh fetch (or from its own change stream)."""


class UnexpectedError(InvariantViolation):
    """A node refused valid input or failed an operation that had to succeed."""


def named(nodes: Nodes) -> list[tuple[str, Node]]:
    """``nodes`` as (name, node) pairs."""
    if isinstance(nodes, Mapping):
        return list(nodes.items())
    return [(str(i), node) for i, node in enumerate(nodes)]


async def stored_entities(storage: StorageEngine) -> list[EntityId]:
    """Every entity ``storage`` holds a state for, sorted (read from the change feed)."""
    seen: set[EntityId] = set()
    offset = 0
    while rows := await storage.read_since(offset, limit=10_000):
        seen.update(row.entity_id for row in rows)
        offset = rows[-1].offset
    return sorted(seen)


async def _entities(
    pairs: list[tuple[str, Node]], entities: Iterable[EntityId] | None
) -> list[EntityId]:
    if entities is not None:
        return sorted(set(entities))
    found: set[EntityId] = set()
    for _, node in pairs:
        found.update(await stored_entities(node.storage))
    return sorted(found)


def _describe(a: tuple[str, EntityState], b: tuple[str, EntityState]) -> str:
    """What differs between two states of one entity (head, then values, then bytes)."""
    (name_a, state_a), (name_b, state_b) = a, b
    parts = []
    if state_a.state.head != state_b.state.head:
        parts.append(
            f"heads {state_a.state.head!r} ({name_a}) vs {state_b.state.head!r} ({name_b})"
        )
    values_a = Entity.from_state(state_a).values()
    values_b = Entity.from_state(state_b).values()
    parts.extend(
        f"{key}: {values_a.get(key)!r} ({name_a}) vs {values_b.get(key)!r} ({name_b})"
        for key in sorted(values_a.keys() | values_b.keys())
        if values_a.get(key) != values_b.get(key)
    )
    if not parts:
        names = [n for n, buf in state_a.state.buffers if state_b.state.buffer(n) != buf]
        parts.append(f"state buffers of {names or 'some backend'} differ byte-wise")
    return "; ".join(parts)


async def _check_memory(
    name: str, node: Node, entity_id: EntityId, stored: EntityState | None
) -> None:
    mine = node.resident_state(entity_id)
    if mine is None:
        return
    if stored is None or mine != stored:
        raise MemoryAhead(
            f"memory holds head {mine.state.head!r}, storage "
            f"{None if stored is None else stored.state.head!r}",
            node=name,
            entity=entity_id,
        )


async def check_convergence(
    nodes: Nodes, entities: Iterable[EntityId] | None = None, *, complete: bool = False
) -> None:
    """Replicas at the same head hold the same state (see module docstring;
    a cache's tombstone is only held to being one, as in :func:`_check_complete`).

    ``entities`` defaults to every entity any node stores. Raises Divergence, MemoryAhead
    or (with ``complete``) Unconverged.
    """
    pairs = named(nodes)
    for entity_id in await _entities(pairs, entities):
        by_history: dict[object, tuple[str, EntityState]] = {}
        replicas = []
        for name, node in pairs:
            events = frozenset(e.id for e in await node.storage.events_of(entity_id))
            stored = await node.storage.get_state(entity_id)
            await _check_memory(name, node, entity_id, stored)
            replicas.append(_Replica(name, node.durable, stored, events))
            if stored is None or (not node.durable and _deleted(stored)):
                continue  # a cache's tombstone: see _check_complete
            for key, held in _histories(events, stored, durable=node.durable):
                seen = by_history.setdefault(key, (name, stored))
                if _fingerprint(seen[1]) != _fingerprint(stored):
                    raise Divergence(
                        f"{name} and {seen[0]} hold the same {held} but differ: "
                        + _describe(seen, (name, stored)),
                        node=name,
                        entity=entity_id,
                    )
        if complete:
            _check_complete(replicas, entity_id)


def _histories(
    events: frozenset[EventId], stored: EntityState, *, durable: bool
) -> list[tuple[object, str]]:
    """What a replica's state is a function of (with how a message names it): its head,
    and on a durable node the events it holds. A cache's events say nothing of its state:
    it holds snapshots, and one its subscriptions do not keep current may lag (two caches
    at different heads are not comparable; only ``complete`` asks that none lags). Before,
    a cache was compared by its events, and one that lagged on a row it had created was
    said to diverge from another holding the same create."""
    head = stored.state.head
    keys: list[tuple[object, str]] = [(("head", head), f"head {head!r}")]
    if durable:
        keys.append((events, f"{len(events)} events"))
    return keys


@dataclass(frozen=True, slots=True)
class _Replica:
    name: str
    durable: bool
    state: EntityState | None
    events: frozenset[EventId]


def _fingerprint(state: EntityState) -> tuple[object, ...]:
    return (state.state.head, state.state.buffers)


def _check_complete(replicas: list[_Replica], entity_id: EntityId) -> None:
    """Every replica holds the same state; every durable one the same events. (A cache — an
    ephemeral replica — may lack a deleted entity, or hold it at an older head: an entity
    leaves every live query once it is deleted, and deletion is sticky, so no read path
    can tell the difference and no subscription sends it further changes.)"""
    durable = [r for r in replicas if r.durable and r.state is not None]
    if durable and all(r.state is not None and _deleted(r.state) for r in durable):
        replicas = [
            r for r in replicas if r.durable or (r.state is not None and not _deleted(r.state))
        ]
    if not replicas:
        return
    first = replicas[0]
    durable = [r for r in replicas if r.durable]
    for other in replicas[1:]:
        if (first.state is None) != (other.state is None):
            holder, lacker = (first, other) if other.state is None else (other, first)
            raise Unconverged(
                f"{holder.name} holds it, {lacker.name} does not",
                node=lacker.name,
                entity=entity_id,
            )
        if first.state is None or other.state is None:
            continue
        if _fingerprint(first.state) != _fingerprint(other.state):
            raise Unconverged(
                _describe((first.name, first.state), (other.name, other.state)),
                node=other.name,
                entity=entity_id,
            )
    for other in durable[1:]:
        if other.events != durable[0].events:
            raise Unconverged(
                f"{other.name} holds {len(other.events - durable[0].events)} events "
                f"{durable[0].name} lacks, and lacks {len(durable[0].events - other.events)} "
                "it holds",
                node=other.name,
                entity=entity_id,
            )


def _deleted(state: EntityState) -> bool:
    return Entity.from_state(state).snapshot().deleted


async def check_no_lost_commits(nodes: Nodes, acknowledged: Mapping[EventId, str]) -> None:
    """Every acknowledged event (id → who acknowledged it) is stored on every durable node.

    Raises LostCommit naming the node and the first missing events.
    """
    wanted = sorted(acknowledged)
    for name, node in named(nodes):
        if not node.durable:
            continue
        found = await node.storage.get_events(wanted)
        missing = [i for i in wanted if i not in found]
        if missing:
            shown = ", ".join(f"{i!r} ({acknowledged[i]})" for i in missing[:5])
            raise LostCommit(
                f"{len(missing)} acknowledged events are not stored: {shown}", node=name
            )


async def check_heads_are_antichains(
    nodes: Nodes, entities: Iterable[EntityId] | None = None
) -> None:
    """No tip of any head is an ancestor of another tip. Raises HeadNotAntichain.

    Ancestry is read from the events of *every* given node (the DAG is one for all), so a
    node that holds a head without the history below it (an ephemeral node's snapshot) is
    still checked against the history its peers hold.
    """
    pairs = named(nodes)
    for entity_id in await _entities(pairs, entities):
        parents: dict[EventId, Clock] = {}
        for _, node in pairs:
            parents.update((e.id, e.parent) for e in await node.storage.events_of(entity_id))
        for name, node in pairs:
            stored = await node.storage.get_state(entity_id)
            if stored is None or len(stored.state.head) < 2:
                continue
            tips = set(stored.state.head)
            for tip in sorted(tips):
                below = ancestry(parents, parents.get(tip, ())) & tips
                if below:
                    raise HeadNotAntichain(
                        f"head tip {tip!r} descends from tip {min(below)!r}",
                        node=name,
                        entity=entity_id,
                    )


async def check_no_dangling_references(
    nodes: Nodes, entities: Iterable[EntityId] | None = None
) -> None:
    """On durable nodes, heads and parents name stored events. Raises DanglingReference."""
    pairs = [(n, node) for n, node in named(nodes) if node.durable]
    for entity_id in await _entities(pairs, entities):
        for name, node in pairs:
            events = {e.id: e for e in await node.storage.events_of(entity_id)}
            stored = await node.storage.get_state(entity_id)
            if stored is not None:
                missing = [i for i in stored.state.head if i not in events]
                if missing:
                    raise DanglingReference(
                        f"the head names {missing[0]!r}, which is not stored",
                        node=name,
                        entity=entity_id,
                    )
            for event in events.values():
                for parent in event.parent:
                    if parent not in events:
                        raise DanglingReference(
                            f"event {event.id!r} names parent {parent!r}, which is not stored",
                            node=name,
                            entity=entity_id,
                        )


async def check_system_membership(nodes: Nodes, entities: Iterable[EntityId] | None = None) -> None:
    """Every stored entity was created in its node's system. Raises ForeignEntity."""
    pairs = named(nodes)
    for entity_id in await _entities(pairs, entities):
        for name, node in pairs:
            root = node.system_root
            stored = await node.storage.get_state(entity_id)
            events = await node.storage.events_of(entity_id)
            if entity_id == root or (stored is None and not events):
                continue
            genesis = next((e for e in events if e.event.is_genesis), None)
            if genesis is None:
                if node.durable:
                    raise ForeignEntity("stored without its genesis", node=name, entity=entity_id)
                continue
            if root is None or genesis.event.system != root:
                raise ForeignEntity(
                    f"created in system {genesis.event.system!r}, but the node's is {root!r}",
                    node=name,
                    entity=entity_id,
                )


class WatchedQuery(Generic[M]):
    """A live query plus a mirror of its change stream, checkable against a fresh fetch.

    Open with :meth:`open`; call :meth:`pump` now and then to consume its change sets (the
    mirror adds ``initial``/``added``/``updated`` and drops ``removed``) and :meth:`check`
    to assert ``items``, the mirror and a fresh ``fetch`` agree.
    """

    def __init__(self, ctx: Context, live: LiveQuery[M], query: str, args: tuple[object, ...]):
        self.ctx = ctx
        self.live = live
        self.query = query
        self.args = args
        self.mirror: dict[EntityId, M] = {}

    @classmethod
    async def open(cls, ctx: Context, model: type[M], query: str, *args: object) -> WatchedQuery[M]:
        """Open a live query on ``ctx`` and start watching it."""
        live = await ctx.query(model, query, *args).__aenter__()
        watched = cls(ctx, live, query, args)
        watched.pump()
        return watched

    def pump(self) -> None:
        """Fold every change set emitted so far into the mirror."""
        for changes in self.live.changes_nowait():
            for view in (*changes.initial, *changes.added, *changes.updated):
                self.mirror[view.id] = view
            for view in changes.removed:
                self.mirror.pop(view.id, None)

    async def check(self, name: str = "?") -> None:
        """Raise LiveQueryMismatch unless items, mirror and a fresh fetch agree."""
        await self.live.wait_settled()
        self.pump()
        model = self.live.model
        items = self.live.items  # (before the fetch, whose answer could mend what it shows)
        fetched = await self.ctx.fetch(model, self.query, *self.args)
        what = f"{model.__name__} query {self.query!r}"
        if items != fetched:
            raise LiveQueryMismatch(
                f"{what}: live items {_ids(items)} but a fetch gives {_ids(fetched)}"
                + _first_difference(items, fetched),
                node=name,
            )
        if sorted(self.mirror, key=bytes) != sorted((v.id for v in items), key=bytes) or any(
            self.mirror[v.id] != v for v in items
        ):
            raise LiveQueryMismatch(
                f"{what}: its change stream adds up to {_ids(list(self.mirror.values()))}, "
                f"its items are {_ids(items)}",
                node=name,
            )


def _ids(views: Sequence[Model]) -> str:
    return "[" + ", ".join(str(v.id)[:8] for v in views) + "]"


def _first_difference(a: Sequence[Model], b: Sequence[Model]) -> str:
    for x, y in zip(a, b, strict=False):
        if x != y:
            return f"; first difference: {x!r} vs {y!r}"
    return ""
