"""The LMDB field index (database ``by_field``) and ``fetch`` over it (ARCHITECTURE.md §6, §8).

Key: the field's prefix, then the value key, then the entity id (32 bytes); value empty.
A state's entries are :func:`~mycelia.storage.plan.index_entries` of its values. The prefix
is ``encode_key(collection) + encode_key(field)``, or, when that is longer than
``MAX_PREFIX``, ``0xFE`` + its SHA-256. An entry longer than LMDB's key limit (a long
string, say) is written as a *long entry*, ``prefix + 0xFF + entity id``: no value key
starts with 0xFF, so long entries sort after the field's others and inside no plan range.

Invariants:

- The index is written only by :func:`reindex`, inside the writer's transaction that
  writes the state, from the previous values read in that same transaction: no snapshot
  ever sees entries that disagree with its states. A migrated store gets its index from
  :func:`build_index` in the transaction that bumps the layout version.
- Prefixes are prefix-free (keys of strings, or 0xFE and a fixed-length hash; a SHA-256
  collision is the one assumption): one field's entries are one contiguous range, and the
  value keys ``[low, high)`` of a plan are the index keys ``[prefix + low, prefix + high)``.
- A walk over a plan reads its ranges and the field's long entries (their value keys
  recomputed from the stored values, kept if in range) merged in the walk's order.
- An entity's collection never changes (it is fixed by its genesis), so its previous
  entries are found under the collection of the state that replaces it.
- :func:`fetch_in` returns exactly ``sort_rows`` over the collection: candidates are a
  superset of the matching rows (see :mod:`mycelia.storage.plan`), the whole predicate is
  evaluated on each, and the order is the index walk of an ordered plan, the ids as read
  for a query with neither a plan nor ORDER BY (the collection's ids ascending: what
  ``sort_rows`` gives them), or ``sort_rows`` itself, fed one row at a time: a LIMIT holds
  about its limit's rows however many it ranks, and only the result's states are decoded.
- With ``after`` (a keyset position) it returns the rows after it only. A query without
  ORDER BY reads the ids after it only and stops at its limit in id order (the
  collection's ids ascending; a plan's ids sorted first), and an ordered plan's walk
  starts at the position (:func:`_plan_ids`): a page of a keyset-paged answer reads about
  its own rows, not the rest of the result.
- With a ``budget`` it raises :class:`OverBudget` as soon as it would read more candidate
  rows than that, so the caller can redo the read off the event loop.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Final, TypeVar

from mycelia.errors import StorageCorrupt
from mycelia.proto.ids import ID_LENGTH
from mycelia.proto.query import (
    After,
    Placeholder,
    Query,
    encode_key,
    evaluate,
    invert_key,
    sort_rows,
)
from mycelia.proto.query.compile import compile_predicate
from mycelia.retrieval import StoredState
from mycelia.storage.lmdb_format import Databases, stored_state, stored_values
from mycelia.storage.plan import IndexPlan, KeyRange, first_id, index_entries, successor

if TYPE_CHECKING:
    import lmdb

    Txn = lmdb.Transaction[bytes]
    Cursor = lmdb.Cursor[bytes]

__all__ = [
    "MAX_KEY",
    "MAX_PREFIX",
    "OverBudget",
    "build_index",
    "entry_keys",
    "fetch_in",
    "field_prefix",
    "reindex",
]

MAX_KEY: Final = 511
"""LMDB's key size limit (``Environment.max_key_size()`` of every standard build)."""
MAX_PREFIX: Final = 256
"""Longest field prefix kept as is; longer ones are hashed (so long entries always fit)."""
_HASHED: Final = b"\xfe"
_LONG: Final = b"\xff"
Entry = tuple[bytes, bytes]
"""(value key, entity id) of one index entry."""
T = TypeVar("T")


class OverBudget(Exception):
    """:func:`fetch_in` would read more candidate rows than its budget allows."""


@functools.lru_cache(maxsize=4096)
@functools.lru_cache(maxsize=4096)  # every write asks again for the same few fields
def field_prefix(collection: str, field: str) -> bytes:
    """The prefix of every ``by_field`` key of ``field`` in ``collection``."""
    prefix = encode_key(collection) + encode_key(field)
    return prefix if len(prefix) <= MAX_PREFIX else _HASHED + hashlib.sha256(prefix).digest()


def entry_keys(collection: str, entity_id: bytes, values: Mapping[str, object]) -> frozenset[bytes]:
    """Every ``by_field`` key of one state; raises StorageError for an unindexable value."""
    keys = set()
    for field, value_key in index_entries(values, longest=MAX_KEY).items():
        prefix = field_prefix(collection, field)
        key = prefix + value_key + entity_id
        keys.add(key if value_key and len(key) <= MAX_KEY else prefix + _LONG + entity_id)
    return frozenset(keys)


def reindex(
    txn: Txn,
    db: lmdb._Database,
    *,
    collection: str,
    entity_id: bytes,
    previous: bytes | None,
    keys: frozenset[bytes],
) -> None:
    """Replace the entries of a state whose previous ``states`` value was ``previous``."""
    old: frozenset[bytes] = frozenset()
    if previous is not None:
        old = entry_keys(collection, entity_id, stored_values(previous))
    for key in old - keys:
        txn.delete(key, db=db)
    for key in keys - old:
        txn.put(key, b"", db=db)


def build_index(txn: Txn, dbs: Databases) -> None:
    """Fill ``by_field`` from every stored state (the layout 1 → 2 migration)."""
    by_field = dbs[b"by_field"]
    for entity_id, value in txn.cursor(db=dbs[b"states"]):
        collection = stored_state(value, txn, dbs).collection
        for key in entry_keys(collection, entity_id, stored_values(value)):
            txn.put(key, b"", db=by_field)


def fetch_in(
    txn: Txn,
    dbs: Databases,
    collection: str,
    query: Query,
    *,
    plan: IndexPlan | None,
    budget: int | None,
    after: After | None = None,
) -> list[StoredState]:
    """The states of ``collection`` matching the bound ``query``, in its order, at most its
    limit (see the module docstring); ``plan`` from ``plan_query(query)``; with ``after``,
    those after that position only."""
    if plan is not None and plan.ordered:
        return _walk_in_order(txn, dbs, collection, query, plan=plan, budget=budget, after=after)
    first = first_id(query, after)
    candidates: Iterable[bytes]
    if plan is None:  # ids ascending: a query without ORDER BY stops at its limit
        candidates = _collection_ids(txn, dbs[b"by_collection"], collection, first)
        wanted = query.limit if not query.order_by and isinstance(query.limit, int) else -1
    else:
        candidates = _plan_ids(txn, dbs, collection, plan, budget)
        if first is not None:
            candidates = _above(candidates, first)
        wanted = -1
        if not query.order_by and isinstance(query.limit, int):  # a page: its first ids
            candidates, wanted = sorted(set(_bounded(candidates, budget))), query.limit
    read = _Reader(txn, dbs, collection, indexed=plan is not None)
    candidates = _bounded(candidates, budget)
    if not query.order_by and (plan is None or wanted >= 0):  # ids ascending, to the limit
        return read.first(candidates, query, wanted)
    # Ordered here, as read: a row ranked out is let go at once, and only the result's
    # states are decoded (a LIMIT over a large collection holds about its LIMIT's rows).
    ranked = sort_rows(read.values(candidates), query, after=after)
    return [read.row(entity_id, values) for entity_id, values in ranked]


class _Reader:
    """Reads the states of candidate ids for :func:`fetch_in` (``indexed``: the ids come
    from the field index, so each must have a state)."""

    def __init__(self, txn: Txn, dbs: Databases, collection: str, *, indexed: bool) -> None:
        self._txn, self._dbs, self._states = txn, dbs, dbs[b"states"]
        self._collection, self._indexed = collection, indexed

    def first(self, ids: Iterable[bytes], query: Query, wanted: int) -> list[StoredState]:
        """The rows of ``ids`` matching ``query``, in their order, at most ``wanted``
        (all of them for -1)."""
        matches, found = compile_predicate(query.predicate), []
        for entity_id in ids:
            value = self._get(entity_id)
            if value is None:
                continue
            values = stored_values(value)
            if matches(values):  # each row decoded whole as it is read: no copy of them all
                found.append(StoredState(stored_state(value, self._txn, self._dbs), values))
                if len(found) == wanted:
                    break
        return found

    def values(self, ids: Iterable[bytes]) -> Iterator[tuple[bytes, Mapping[str, object]]]:
        """The values of each of ``ids``, read one at a time."""
        for entity_id in ids:
            value = self._get(entity_id)
            if value is not None:
                yield entity_id, stored_values(value)

    def row(self, entity_id: bytes, values: Mapping[str, object]) -> StoredState:
        """The stored state of ``entity_id`` (read before in this transaction)."""
        value = self._get(entity_id)
        if value is None:
            raise StorageCorrupt(f"a state of {self._collection!r} went missing in a read")
        return StoredState(stored_state(value, self._txn, self._dbs), values)

    def _get(self, entity_id: bytes) -> bytes | None:
        value: bytes | None = self._txn.get(entity_id, db=self._states)
        if value is None and self._indexed:
            raise StorageCorrupt(f"the field index of {self._collection!r} names a missing state")
        return value


def _walk_in_order(
    txn: Txn,
    dbs: Databases,
    collection: str,
    query: Query,
    *,
    plan: IndexPlan,
    budget: int | None,
    after: After | None,
) -> list[StoredState]:
    """Walk an ordered plan's ranges in the query's order (from the position ``after``),
    stopping at the limit."""
    limit = query.limit
    assert not isinstance(limit, Placeholder)  # the caller checked the query is bound
    states = dbs[b"states"]
    walk = _plan_ids(txn, dbs, collection, plan, budget, after=after)
    found: list[StoredState] = []
    for entity_id in _bounded(walk, budget):
        value = txn.get(entity_id, db=states)
        if value is None:
            raise StorageCorrupt(f"the field index of {collection!r} names a missing state")
        values = stored_values(value)
        if evaluate(query.predicate, values):
            found.append(StoredState(stored_state(value, txn, dbs), values))
            if len(found) == limit:
                break
    return found


def _bounded(items: Iterable[T], budget: int | None) -> Iterator[T]:
    for count, item in enumerate(items, 1):
        if budget is not None and count > budget:
            raise OverBudget
        yield item


def _collection_ids(
    txn: Txn, db: lmdb._Database, collection: str, after: bytes | None = None
) -> Iterator[bytes]:
    """The collection's ids ascending (those after ``after`` only)."""
    prefix = collection.encode() + b"\0"
    cursor = txn.cursor(db=db)
    if cursor.set_range(prefix if after is None else prefix + after):
        for key in cursor.iternext(keys=True, values=False):
            if not key.startswith(prefix):
                return
            entity_id = key[len(prefix) :]
            if entity_id != after:
                yield entity_id


def _plan_ids(
    txn: Txn,
    dbs: Databases,
    collection: str,
    plan: IndexPlan,
    budget: int | None,
    *,
    after: After | None = None,
) -> Iterator[bytes]:
    """Entity ids in the plan's ranges in walk order (:meth:`IndexPlan.walk_key`): by
    (key, id), or for a descending ordered plan by key descending, ids ascending; with
    ``after`` (an ordered plan's: its key is the walk's), those after it only, the walk
    starting at it (:func:`_from`)."""
    prefix = field_prefix(collection, plan.field)
    cursor = txn.cursor(db=dbs[b"by_field"])
    walk: Callable[[Cursor, bytes, KeyRange], Iterator[Entry]] = _ascending
    ranges: Iterable[KeyRange] = plan.ranges
    if plan.ordered and plan.descending:
        walk, ranges = _descending, reversed(plan.ranges)
    # (Each step a call, not a generator expression: compiled by mypyc, that form walked
    # the ranges unclipped; the filter below kept the result right, at the old cost.)
    spans = list(ranges if after is None else _from(ranges, plan, after))
    entries: Iterable[Entry] = itertools.chain.from_iterable(
        [walk(cursor, prefix, span) for span in spans]
    )
    long = _long_entries(txn, dbs, prefix, plan, budget)
    if long:
        entries = heapq.merge(entries, long, key=lambda entry: plan.walk_key(*entry))
    if after is not None:  # what the clipped ranges still hold at or before it (counted)
        entries = _past(_bounded(entries, budget), plan, after)
    return _ids(entries)


def _past(entries: Iterable[Entry], plan: IndexPlan, after: After) -> Iterator[Entry]:
    for entry in entries:
        if plan.walk_key(*entry) > after:
            yield entry


def _above(ids: Iterable[bytes], first: bytes) -> Iterator[bytes]:
    for entity_id in ids:
        if entity_id > first:
            yield entity_id


def _ids(entries: Iterable[Entry]) -> Iterator[bytes]:
    for _, entity_id in entries:
        yield entity_id


def _from(ranges: Iterable[KeyRange], plan: IndexPlan, after: After) -> Iterator[KeyRange]:
    """``ranges`` (in walk order) clipped to the value keys a walk from ``after`` can still
    meet: ascending, from the position's key up (its entry itself starts the walk: an
    index key is ``prefix + value key + id``); descending, from its key down (a walk meets
    that key's ids, ascending, before the keys below)."""
    if plan.descending:
        high = successor(invert_key(after.key))
        for r in ranges:
            if r.low < high:
                yield KeyRange(r.low, min(r.high, high))
        return
    for r in ranges:
        if after.key < r.low:
            yield r
        elif after.key < r.high:
            yield KeyRange(after.key + after.entity_id, r.high)


def _long_entries(
    txn: Txn, dbs: Databases, prefix: bytes, plan: IndexPlan, budget: int | None
) -> list[Entry]:
    """The field's long entries whose (recomputed) value key the plan covers, sorted."""
    start = prefix + _LONG
    cursor = txn.cursor(db=dbs[b"by_field"])
    found = []
    if cursor.set_range(start):
        for count, key in enumerate(cursor.iternext(keys=True, values=False), 1):
            if not key.startswith(start):
                break
            if budget is not None and count > budget:
                raise OverBudget
            entity_id = key[len(start) :]
            value = txn.get(entity_id, db=dbs[b"states"])
            if value is None:
                raise StorageCorrupt("the field index names a missing state")
            value_key = encode_key(stored_values(value).get(plan.field))
            if plan.covers(value_key):
                found.append((value_key, entity_id))
    return sorted(found, key=lambda entry: plan.walk_key(*entry))


def _ascending(cursor: Cursor, prefix: bytes, span: KeyRange) -> Iterator[Entry]:
    high = prefix + span.high
    if cursor.set_range(prefix + span.low):
        for key in cursor.iternext(keys=True, values=False):
            if key >= high:
                return
            yield key[len(prefix) : -ID_LENGTH], key[-ID_LENGTH:]


def _descending(cursor: Cursor, prefix: bytes, span: KeyRange) -> Iterator[Entry]:
    low = prefix + span.low
    positioned = cursor.prev() if cursor.set_range(prefix + span.high) else cursor.last()
    group_key = b""
    group: list[bytes] = []
    while positioned:
        key = cursor.key()
        if key < low:
            break
        if key[len(prefix) : -ID_LENGTH] != group_key:
            # Walked backwards, one key's ids came descending: give them ascending.
            yield from ((group_key, entity_id) for entity_id in reversed(group))
            group_key, group = key[len(prefix) : -ID_LENGTH], []
        group.append(key[-ID_LENGTH:])
        positioned = cursor.prev()
    yield from ((group_key, entity_id) for entity_id in reversed(group))
