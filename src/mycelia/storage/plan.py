"""Index plans: which range of a field index can stand in for a collection scan (§6, §8).

Pure; shared by the LMDB and PostgreSQL engines, whose ``fetch`` must return exactly what
:func:`~mycelia.proto.query.sort_rows` returns over ``scan`` (the package docstring of
:mod:`mycelia.proto.query` is the semantics this mirrors).

What is indexed (:func:`index_entries`): for every stored state, one entry per top-level
field whose value is a bool, number, string or bytes, holding ``encode_key(value)``. Nulls,
NaN, missing fields, lists and objects have no entry: no comparison with a literal and no
``IN`` can be true for them (a null side is false; literals are scalars, so ``=`` needs the
same scalar class and ``< <= > >=`` an ordered one).

Invariants of a plan (:func:`plan_query`):

- It names the top-level conjuncts C of the predicate on one field ``f`` that are
  indexable (comparisons with a literal, non-negated ``IN``, on the one-segment path
  ``f``) and key ranges R such that, for every row, all of C hold iff the row has an
  entry for ``f`` with a key in R. Rows outside R cannot match; the engines still
  evaluate the *whole* predicate on every candidate.
- Every range bound is a value key, the :func:`successor` of one, or a class's first tag
  or last tag + 1; none of these lies strictly between a key and its successor, which is
  what makes a value-key range the same as an index-key range (prefix-freeness does the
  rest) and an intersection of ranges exact.
- ``ranges`` are ascending and disjoint, each half-open ``[low, high)`` over value keys.
  Keys are prefix-free, so an index key ``prefix + value key + id`` lies in
  ``[prefix + low, prefix + high)`` iff its value key does.
- No ranges: C is false for every row (``x = NULL``, ``x IN ()``, ``x < FALSE``, ``FALSE``,
  ``x > 5 AND x < 3``), so the result is empty.
- ``ordered``: the query's ORDER BY is exactly ``f`` (ASC or DESC). Every matching row then
  has an entry in R and its ORDER BY key is that entry's value key (inverted for DESC), so
  walking R by (key, id) — by key descending, ids ascending within a key, for DESC — is
  the query's order and LIMIT may stop the walk early.

Choice, without statistics: the ORDER BY field when it has indexable conjuncts and there
is a LIMIT (the walk stops early), else the first field restricted to points (``=``,
``IN``: usually selective), else the first field with a range; no indexable conjunct
means no plan (scan the collection).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from mycelia.errors import InvalidArgument, StorageError
from mycelia.proto.query import (
    After,
    And,
    Comparison,
    Const,
    In,
    Op,
    Predicate,
    Query,
    encode_key,
    invert_key,
)
from mycelia.proto.query.keys import TAG_BYTES, TAG_FALSE, TAG_NUMBER, TAG_STRING, TAG_TRUE
from mycelia.proto.query.values import ORDERED_CLASSES, Collation, class_of

__all__ = [
    "LONG",
    "IndexPlan",
    "KeyRange",
    "check_bound",
    "conjuncts",
    "first_id",
    "index_entries",
    "matches_nothing",
    "plan_query",
]

_CLASS_BOUNDS: Final = {
    Collation.BOOL: (bytes([TAG_FALSE]), bytes([TAG_TRUE + 1])),
    Collation.NUMBER: (bytes([TAG_NUMBER]), bytes([TAG_NUMBER + 1])),
    Collation.STRING: (bytes([TAG_STRING]), bytes([TAG_STRING + 1])),
    Collation.BYTES: (bytes([TAG_BYTES]), bytes([TAG_BYTES + 1])),
}
"""Each ordered class's value keys, as ``[first tag, last tag + 1)`` (keys.py's layout)."""


@dataclass(frozen=True, slots=True)
class KeyRange:
    """Value keys ``low <= key < high``; ``point``: exactly the keys equal to ``low``."""

    low: bytes
    high: bytes
    point: bool = False


@dataclass(frozen=True, slots=True)
class IndexPlan:
    """Read the index of ``field`` over ``ranges`` (see the module docstring)."""

    field: str
    ranges: tuple[KeyRange, ...]
    ordered: bool = False
    descending: bool = False

    def covers(self, key: bytes) -> bool:
        """Whether the value key ``key`` lies in one of the ranges."""
        return any(r.low <= key < r.high for r in self.ranges)

    def walk_key(self, key: bytes, entity_id: bytes) -> tuple[bytes, bytes]:
        """The sort key of an entry in the walk's order: (key, id), or for a descending
        ordered plan (inverted key, id) — so entries an index cannot hold (see the engines'
        "long" entries) merge into a walk exactly."""
        return (invert_key(key) if self.ordered and self.descending else key), entity_id


def successor(key: bytes) -> bytes:
    """The smallest byte string above every string that starts with ``key``."""
    stripped = key.rstrip(b"\xff")
    return stripped[:-1] + bytes([stripped[-1] + 1])


def index_entries(values: Mapping[str, object], *, longest: int | None = None) -> dict[str, bytes]:
    """The indexed fields of a row and their value keys (see the module docstring).

    With ``longest``, a string or bytes value whose key is surely longer than ``longest``
    bytes gets :data:`LONG` instead, without being encoded: an engine keeps no key that
    long, and a long text then costs it nothing to index, not a copy of the text a write.

    Raises StorageError for a value outside the value model.
    """
    entries = {}
    try:
        for name, value in values.items():
            if longest is not None and isinstance(value, str | bytes) and len(value) + 3 > longest:
                entries[name] = LONG  # a tag, at least a byte a character, two to end it
                continue
            kind = type(value)
            # Small scalars of exact types go through a cache: a write computes the keys of
            # the values it replaces, which are usually the ones the last write computed.
            small = not isinstance(value, str | bytes) or len(value) <= _CACHED_LENGTH
            key = _cached_key(kind.__name__, value) if kind in _CACHED and small else _key(value)
            if key is not None:
                entries[name] = key
    except InvalidArgument as exc:
        raise StorageError(f"state values cannot be indexed: {exc}") from exc
    return entries


LONG: Final = b""
"""The key :func:`index_entries` gives, with ``longest``, a value whose key is longer (no
value key is empty: each starts with its tag)."""
_CACHED: Final = frozenset({bool, int, float, str, bytes})
_CACHED_LENGTH: Final = 64


def _key(value: object) -> bytes | None:
    """``value``'s key if it is indexed (a bool, number, string or bytes), else None."""
    return encode_key(value) if class_of(value) in ORDERED_CLASSES else None


@functools.lru_cache(maxsize=8192)
def _cached_key(kind: str, value: object) -> bytes | None:
    # Keyed by the exact type too: True, 1 and 1.0 are one dict key but not one value
    # key. -0.0 and 0.0 share a slot, and a key (both are +0.0's); NaN never hits.
    return _key(value)


def check_bound(query: Query) -> None:
    """Raise InvalidArgument if ``query`` still has placeholders (as ``sort_rows`` does)."""
    if query.placeholders:
        raise InvalidArgument("the query has an unbound '?': call Query.bind first")


def first_id(query: Query, after: After | None) -> bytes | None:
    """Where a read of ``query`` in id order starts: without ORDER BY a position is an id,
    and only the ids after it are read (``None``: from the first id, or an ordered query,
    whose position is not an id)."""
    return after.entity_id if after is not None and not query.order_by else None


def matches_nothing(query: Query, plan: IndexPlan | None) -> bool:
    """Whether a bound query matches nothing, whatever is stored: LIMIT 0, or an index
    plan with no range left (contradictory conjuncts). Every engine's fetch asks first."""
    return query.limit == 0 or (plan is not None and not plan.ranges)


def conjuncts(predicate: Predicate) -> Iterator[Predicate]:
    """The top-level conjuncts of ``predicate`` (nested ANDs flattened)."""
    if isinstance(predicate, And):
        for item in predicate.items:
            yield from conjuncts(item)
    else:
        yield predicate


def plan_query(query: Query) -> IndexPlan | None:
    """The plan for a bound query, or None when no conjunct is indexable (scan instead).

    Indexable conjuncts on the same field are intersected (``x > 5 AND x < 9`` reads one
    range); keys at any bound of :func:`_comparison_range` are prefix-free key bounds, so
    an intersection is exact too.
    """
    by_field: dict[str, tuple[KeyRange, ...]] = {}
    for conjunct in conjuncts(query.predicate):
        found = _conjunct_plan(conjunct)
        if found is None:
            continue
        if not found.ranges:
            return found
        known = by_field.get(found.field)
        ranges = found.ranges if known is None else _intersect(known, found.ranges)
        if not ranges:
            return IndexPlan(found.field, ())
        by_field[found.field] = ranges
    if not by_field:
        return None
    order = query.order_by[0] if len(query.order_by) == 1 else None
    order_field = order.path[0] if order is not None and len(order.path) == 1 else None
    if order_field in by_field and query.limit is not None:
        field = order_field
    else:
        points = [f for f, ranges in by_field.items() if all(r.point for r in ranges)]
        field = (points or list(by_field))[0]
    ordered = field == order_field
    return IndexPlan(field, by_field[field], ordered, ordered and query.order_by[0].descending)


def _intersect(left: tuple[KeyRange, ...], right: tuple[KeyRange, ...]) -> tuple[KeyRange, ...]:
    """The ranges holding the keys in both ``left`` and ``right`` (ascending, disjoint)."""
    both = []
    for a in left:
        for b in right:
            low, high = max(a.low, b.low), min(a.high, b.high)
            if low < high:
                # No bound falls strictly inside a point's range (module docstring), so
                # what is left of a point is that point.
                both.append(KeyRange(low, high, a.point or b.point))
    return tuple(sorted(both, key=lambda r: r.low))


def _conjunct_plan(conjunct: Predicate) -> IndexPlan | None:
    if isinstance(conjunct, Const):
        return None if conjunct.value else IndexPlan("", ())
    if isinstance(conjunct, In) and not conjunct.negated and len(conjunct.path) == 1:
        keys = sorted({encode_key(v) for v in conjunct.values if v is not None})
        return IndexPlan(conjunct.path[0], tuple(KeyRange(k, successor(k), True) for k in keys))
    if isinstance(conjunct, Comparison) and len(conjunct.path) == 1 and conjunct.op is not Op.NE:
        found = _comparison_range(conjunct.op, conjunct.value)
        return IndexPlan(conjunct.path[0], () if found is None else (found,))
    return None


def _comparison_range(op: Op, literal: object) -> KeyRange | None:
    """The value keys for which ``field op literal`` holds (None: no key)."""
    kind = class_of(literal)
    if kind is Collation.NULL:
        return None  # a comparison with a null side is false
    key = encode_key(literal)
    if op is Op.EQ:
        return KeyRange(key, successor(key), True)
    start, end = _CLASS_BOUNDS[kind]
    low, high = {
        Op.GT: (successor(key), end),
        Op.GE: (key, end),
        Op.LT: (start, key),
        Op.LE: (start, successor(key)),
    }[op]
    return KeyRange(low, high) if low < high else None
