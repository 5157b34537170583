"""The reactor: the node's one change listener for live queries (ARCHITECTURE.md §8).

Its **candidate index** maps each entity to the queries it belongs to, and each query to
what an entity outside it must now hold to join it, so a commit re-evaluates only the
queries it can affect (O(affected queries × log n), not O(queries)):

- a query that pins a field to a value (``group = ? AND ...``) is indexed under that
  (field, value);
- else a query whose top-level conjuncts restrict a field to key ranges (``x > ? AND
  x <= ?``, ``x IN (...)``: the storage engines' index plan,
  :func:`~mycelia.storage.plan.plan_query`) is indexed under those ranges of that field:
  a non-member can join only if its new value's key lies in one, and a field the query
  reads changed (or it was created);
- else it is indexed under every field its predicate or ORDER BY reads.

The queries themselves (:class:`~mycelia.node.live.LiveQuery`) apply what they are given;
the reactor only routes, through the :class:`~mycelia.node.ports.Standing` port.

Invariants:

- A change reaches every query it can concern: a member's, a pinned query whose value
  the entity now has, a ranged query whose ranges hold the entity's new key (on a create,
  or when a field it reads changed), every other query of the collection on a create, and
  every other query reading a changed field. (A ranged query's conjuncts on its field hold
  exactly for the keys in its ranges, so an entity outside them cannot match it.)
- Several changes of one entity in a batch reach a query as one, from the first
  ``before`` to the last ``after``.
- Queries hear of a change in the order they were opened in (insertion-ordered dicts,
  not sets), in every run.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Collection, Mapping
from typing import TypeVar

from mycelia.entity import EntityChange
from mycelia.errors import InvalidArgument, StorageError
from mycelia.node.ports import Standing
from mycelia.proto import EntityId
from mycelia.proto.query import And, Comparison, Op, Placeholder, Query, encode_key
from mycelia.storage.plan import KeyRange, index_entries, plan_query

__all__ = ["Reactor"]


class Reactor:
    """The node's live queries and their candidate index; one change listener for all.

    A query that pins a field to a value (``group = ? AND ...``) is indexed under that
    (field, value): a change can only concern it if the entity is a member or now has that
    value. A query that restricts a field to key ranges is indexed under those ranges: a
    change concerns it if the entity is a member, or its new key lies in a range and a
    field the query reads changed (or it was created). Other queries are indexed under
    every field they read. Members are indexed by entity. A create concerns the pinned and
    ranged queries its values match and every other query. Wire :meth:`on_change` as a
    change listener of the node. (Queries are kept in insertion-ordered dicts, not sets, so
    the order they hear of a change in is the order they were opened in, in every run.)
    """

    def __init__(self) -> None:
        self._by_field: dict[tuple[str, str], _Queries] = {}
        self._pinned: dict[tuple[str, str, bytes], _Queries] = {}
        self._pinned_fields: dict[str, dict[str, None]] = {}
        self._unpinned: dict[str, _Queries] = {}
        self._ranged: dict[tuple[str, str], _Ranges] = {}
        self._ranged_fields: dict[str, dict[str, None]] = {}
        self._reads: dict[Standing, frozenset[str]] = {}
        """The fields each ranged query reads."""
        self._by_entity: dict[EntityId, _Queries] = {}
        self._queries: dict[Standing, str] = {}
        """Every live query registered, with its collection."""
        self._collections: dict[str, int] = {}
        """Live queries registered per collection."""

    def count(self) -> int:
        """Live queries registered."""
        return len(self._queries)

    def collections(self) -> Collection[str]:
        """The collections live queries read now (a view: it changes as queries come and
        go)."""
        return self._collections.keys()

    def tracked(self, entity_id: EntityId) -> bool:
        """Whether some live query holds ``entity_id`` (so its subscription keeps it fresh)."""
        return entity_id in self._by_entity

    def track(self, entity_id: EntityId, live: Standing) -> None:
        """Note that ``entity_id`` is a member of ``live`` (it is a candidate for it)."""
        self._by_entity.setdefault(entity_id, {})[live] = None

    def untrack(self, entity_id: EntityId, live: Standing) -> None:
        """Note that ``entity_id`` left ``live``."""
        queries = self._by_entity.get(entity_id)
        if queries is not None:
            queries.pop(live, None)
            if not queries:
                del self._by_entity[entity_id]

    def add(self, live: Standing) -> None:
        """Register a live query."""
        collection = live.collection
        if live not in self._queries:
            self._queries[live] = collection
            self._collections[collection] = self._collections.get(collection, 0) + 1
        pin = _pinned(live.query)
        if pin is not None:
            name, key = pin
            self._pinned.setdefault((collection, name, key), {})[live] = None
            self._pinned_fields.setdefault(collection, {})[name] = None
            return
        plan = _ranged(live.query)
        if plan is not None:
            name, ranges = plan
            self._ranged.setdefault((collection, name), _Ranges()).add(live, ranges)
            self._ranged_fields.setdefault(collection, {})[name] = None
            self._reads[live] = live.query.fields()
            return
        self._unpinned.setdefault(collection, {})[live] = None
        for name in live.query.fields():
            self._by_field.setdefault((collection, name), {})[live] = None

    def remove(self, live: Standing) -> None:
        """Forget a live query."""
        collection = self._queries.pop(live, None)
        if collection is not None:
            left = self._collections[collection] - 1
            if left:
                self._collections[collection] = left
            else:
                del self._collections[collection]
        _discard(self._by_field, live)
        _discard(self._pinned, live)
        _discard(self._unpinned, live)
        if self._reads.pop(live, None) is not None:
            for key, ranges in list(self._ranged.items()):
                if ranges.remove(live) and not ranges:
                    del self._ranged[key]

    def reindex(self, live: Standing) -> None:
        """Refresh a query's index entries after its query changed."""
        self.remove(live)
        self.add(live)

    def _candidates(self, change: EntityChange) -> _Queries:
        collection = change.after.collection
        candidates = dict(self._by_entity.get(change.after.entity_id, {}))
        values = change.after.values
        for name in self._pinned_fields.get(collection, {}):
            if name in values:
                try:
                    key = encode_key(values[name])
                except InvalidArgument:
                    continue
                candidates.update(self._pinned.get((collection, name, key), {}))
        for name in self._ranged_fields.get(collection, {}):
            ranges = self._ranged.get((collection, name))
            at = _index_key(values, name) if ranges is not None else None
            if ranges is None or at is None:
                continue  # no key: the conjuncts on the field cannot hold
            created, changed = not change.before.exists, change.changed
            for live in ranges.holding(at):
                if created or not changed.isdisjoint(self._reads[live]):
                    candidates[live] = None
        if not change.before.exists:
            candidates.update(self._unpinned.get(collection, {}))
        else:
            for name in sorted(change.changed):
                candidates.update(self._by_field.get((collection, name), {}))
        return candidates

    def on_change(self, changes: list[EntityChange]) -> None:
        """Route committed changes to the live queries they can concern."""
        read = self._collections
        changes = [c for c in changes if c.after.collection in read]
        if not changes:
            return  # no live query reads these collections (a server's usual case)
        touched: dict[Standing, list[EntityChange]] = {}
        for change in _per_entity(changes):
            for live in self._candidates(change):
                touched.setdefault(live, []).append(change)
        views: dict[object, object] = {}  # one view per (model, entity) for this batch
        for live, mine in touched.items():
            live.apply(mine, views)


_Queries = dict[Standing, None]
"""Live queries as an insertion-ordered set."""

K = TypeVar("K")


def _per_entity(changes: list[EntityChange]) -> list[EntityChange]:
    """One change per entity: several in one batch (a genesis, then an update released for
    it) become one, from the first ``before`` to the last ``after``, so a query that only
    learns of the entity from the first is not left holding a stale view."""
    merged: dict[EntityId, EntityChange] = {}
    for change in changes:
        entity_id = change.after.entity_id
        earlier = merged.get(entity_id)
        merged[entity_id] = (
            change
            if earlier is None
            else EntityChange(
                earlier.before,
                change.after,
                earlier.events + change.events,
                earlier.changed | change.changed,
            )
        )
    return list(merged.values())


def _discard(index: dict[K, _Queries], live: Standing) -> None:
    for key, queries in list(index.items()):
        queries.pop(live, None)
        if not queries:
            del index[key]


class _Ranges:
    """The key ranges of one field's ranged queries, found by a key they hold.

    Sorted by low bound, with the largest high bound of every subtree of the implicit
    binary tree over them, built on the first lookup after a change: a lookup visits only
    the subtrees holding a hit, O(log n) each. Hits come in registration order.
    """

    def __init__(self) -> None:
        self._queries: dict[Standing, tuple[KeyRange, ...]] = {}
        self._seq: dict[Standing, int] = {}
        self._next = 0
        self._built: tuple[list[bytes], list[Standing], list[bytes]] | None = None
        """(low bounds, their queries, max high bound per tree node), sorted by low."""

    def __bool__(self) -> bool:
        return bool(self._queries)

    def add(self, live: Standing, ranges: tuple[KeyRange, ...]) -> None:
        self._queries[live] = ranges
        self._seq[live] = self._next
        self._next += 1
        self._built = None

    def remove(self, live: Standing) -> bool:
        """Forget ``live``; whether it was here."""
        if self._queries.pop(live, None) is None:
            return False
        del self._seq[live]
        self._built = None
        return True

    def holding(self, key: bytes) -> list[Standing]:
        """The queries one of whose ranges holds ``key``."""
        lows, lives, tree = self._built or self._build()
        end = bisect_right(lows, key)  # the ranges [0, end) start at or below the key
        size = len(tree) // 2
        found: dict[Standing, None] = {}
        stack = [(1, 0, size)] if end else []  # (node, its first leaf, its last leaf + 1)
        while stack:
            node, first, last = stack.pop()
            if first >= end or tree[node] <= key:
                continue  # no range here starts at or below the key, or all end by it
            if node >= size:
                found[lives[first]] = None
                continue
            middle = (first + last) // 2
            stack.append((2 * node + 1, middle, last))
            stack.append((2 * node, first, middle))
        seq = self._seq
        return sorted(found, key=seq.__getitem__)

    def _build(self) -> tuple[list[bytes], list[Standing], list[bytes]]:
        seq = self._seq
        entries = sorted(
            ((r.low, r.high, live) for live, ranges in self._queries.items() for r in ranges),
            key=lambda e: (e[0], seq[e[2]]),
        )
        size = 1
        while size < len(entries):
            size *= 2
        tree = [b""] * (2 * size)  # b"" ends below every key: an empty leaf holds none
        tree[size : size + len(entries)] = [e[1] for e in entries]
        for node in range(size - 1, 0, -1):
            tree[node] = max(tree[2 * node], tree[2 * node + 1])
        self._built = ([e[0] for e in entries], [e[2] for e in entries], tree)
        return self._built


def _ranged(query: Query) -> tuple[str, tuple[KeyRange, ...]] | None:
    """The field and key ranges an entity must hold a key in to match ``query`` (the
    storage engines' index plan), or None when no top-level conjunct restricts one field."""
    try:
        plan = plan_query(query)
    except (InvalidArgument, StorageError):
        return None
    if plan is None or not plan.field:
        return None
    return plan.field, plan.ranges


def _index_key(values: Mapping[str, object], name: str) -> bytes | None:
    """The index key of field ``name`` of ``values``, if it is indexable."""
    value = values.get(name)
    if value is None:
        return None
    try:
        return index_entries({name: value}).get(name)
    except StorageError:
        return None


def _pinned(query: Query) -> tuple[str, bytes] | None:
    """A (field, value key) the query requires with ``field = value`` at its top level."""
    predicate = query.predicate
    items = predicate.items if isinstance(predicate, And) else (predicate,)
    for item in items:
        if (
            isinstance(item, Comparison)
            and item.op is Op.EQ
            and len(item.path) == 1
            and not isinstance(item.value, Placeholder)
        ):
            return item.path[0], encode_key(item.value)
    return None
