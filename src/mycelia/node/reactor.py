"""The reactor: the node's one change listener for live queries (ARCHITECTURE.md §8).

Its **candidate index** maps (collection, field) to the queries whose predicate or ORDER
BY reads that field, and each entity to the queries it belongs to, so a commit
re-evaluates only the queries it can affect: a query is touched by a change when the
entity is one of its members or a field it reads changed. A query that pins a field to a
value (``group = ? AND ...``) is indexed under that (field, value) instead. The queries
themselves (:class:`~mycelia.node.live.LiveQuery`) apply what they are given; the reactor
only routes, through the :class:`~mycelia.node.ports.Standing` port.

Invariants:

- A change reaches every query it can concern: a member's, a pinned query whose value
  the entity now has, every unpinned query of the collection on a create, and every
  query reading a changed field.
- Several changes of one entity in a batch reach a query as one, from the first
  ``before`` to the last ``after``.
- Queries hear of a change in the order they were opened in (insertion-ordered dicts,
  not sets), in every run.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TypeVar

from mycelia.entity import EntityChange
from mycelia.errors import InvalidArgument
from mycelia.node.ports import Standing
from mycelia.proto import EntityId
from mycelia.proto.query import And, Comparison, Op, Placeholder, Query, encode_key

__all__ = ["Reactor"]


class Reactor:
    """The node's live queries and their candidate index; one change listener for all.

    A query that pins a field to a value (``group = ? AND ...``) is indexed under that
    (field, value): a change can only concern it if the entity is a member or now has that
    value. Other queries are indexed under every field they read. Members are indexed by
    entity. A create concerns the pinned queries of its values and every unpinned query.
    Wire :meth:`on_change` as a change listener of the node. (Queries are kept in
    insertion-ordered dicts, not sets, so the order they hear of a change in is the order
    they were opened in, in every run.)
    """

    def __init__(self) -> None:
        self._by_field: dict[tuple[str, str], _Queries] = {}
        self._pinned: dict[tuple[str, str, bytes], _Queries] = {}
        self._pinned_fields: dict[str, dict[str, None]] = {}
        self._unpinned: dict[str, _Queries] = {}
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
        if not change.before.exists:
            candidates.update(self._unpinned.get(collection, {}))
        else:
            for name in sorted(change.changed):
                candidates.update(self._by_field.get((collection, name), {}))
        return candidates

    def on_change(self, changes: list[EntityChange]) -> None:
        """Route committed changes to the live queries they can concern."""
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
