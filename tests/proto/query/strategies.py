"""Hypothesis strategies for query tests: values of the whole value model, and query ASTs."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from mycelia.proto.query import (
    And,
    Comparison,
    Const,
    FieldComparison,
    In,
    IsNull,
    Not,
    Op,
    Or,
    OrderKey,
    Placeholder,
    Predicate,
    Query,
)
from mycelia.proto.query.values import INT_MAX, INT_MIN

_EDGE_INTS = [0, 1, -1, 2**53, -(2**53), 2**63 - 1, -(2**63), 2**64 - 1, 2**62]
_EDGE_FLOATS = [0.0, -0.0, float("inf"), float("-inf"), 2.0**53, 2.0**63, -(2.0**63), 2.0**64]

# Integers next to where float64 loses precision: the hard part of the number encoding.
near_float_limits = st.builds(
    lambda base, delta: base + delta,
    st.sampled_from([2**53, -(2**53), 2**62, 2**63 - 2048, -(2**63) + 2048, 2**64 - 2048]),
    st.integers(-2048, 2047),
)
key_ints = st.one_of(
    st.integers(-(2**63), 2**64 - 1), st.sampled_from(_EDGE_INTS), near_float_limits
)
any_floats = st.one_of(st.floats(), st.sampled_from(_EDGE_FLOATS), key_ints.map(float))
texts = st.text(st.characters(codec="utf-8"), max_size=6) | st.sampled_from(
    ["", "\x00", "\x00\x00", "a\x00", "a", "\U0010ffff", "é"]
)
binaries = st.binary(max_size=6) | st.sampled_from([b"", b"\x00", b"\x00\xff", b"\xff"])
scalars = st.one_of(st.none(), st.booleans(), key_ints, any_floats, texts, binaries)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=8,
)

# -- queries ---------------------------------------------------------------------------------

segments = st.sampled_from(["x", "year", "a_b", "order", "Limit", "x", "_1"]) | st.text(max_size=4)
paths = st.lists(segments, min_size=1, max_size=3).map(tuple)
_MARK = Placeholder(0)
literals = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(INT_MIN, INT_MAX),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
    st.binary(max_size=4),
    st.just(_MARK),
)
ops = st.sampled_from(Op)
leaves: st.SearchStrategy[Predicate] = st.one_of(
    st.builds(Comparison, paths, ops, literals),
    st.builds(FieldComparison, paths, ops, paths),
    st.builds(In, paths, st.lists(literals, max_size=3).map(tuple), st.booleans()),
    st.builds(IsNull, paths, st.booleans()),
    st.builds(Const, st.booleans()),
)
_marked_predicates: st.SearchStrategy[Predicate] = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, min_size=2, max_size=3).map(lambda items: And(tuple(items))),
        st.lists(children, min_size=2, max_size=3).map(lambda items: Or(tuple(items))),
        children.map(Not),
    ),
    max_leaves=8,
)


class _Numbering:
    def __init__(self) -> None:
        self.next = 0

    def take(self) -> Placeholder:
        self.next += 1
        return Placeholder(self.next - 1)


def _renumber(predicate: Predicate, numbering: _Numbering) -> Predicate:
    # The strategies mark every ``?`` with index 0; number them in text order.
    if isinstance(predicate, Comparison) and isinstance(predicate.value, Placeholder):
        return replace(predicate, value=numbering.take())
    if isinstance(predicate, In):
        renumbered = tuple(
            numbering.take() if isinstance(v, Placeholder) else v for v in predicate.values
        )
        return replace(predicate, values=renumbered)
    if isinstance(predicate, And | Or):
        return replace(predicate, items=tuple(_renumber(i, numbering) for i in predicate.items))
    if isinstance(predicate, Not):
        return Not(_renumber(predicate.item, numbering))
    return predicate


predicates: st.SearchStrategy[Predicate] = _marked_predicates.map(
    lambda predicate: _renumber(predicate, _Numbering())
)
"""A random predicate whose ``?`` are numbered 0, 1, ... in text order."""


@st.composite
def queries(draw: st.DrawFn) -> Query:
    """A random query (placeholders included, numbered in text order)."""
    numbering = _Numbering()
    predicate = _renumber(draw(_marked_predicates), numbering)
    order_by = tuple(draw(st.lists(st.builds(OrderKey, paths, st.booleans()), max_size=3)))
    limit_kind = draw(st.sampled_from(["none", "int", "placeholder"]))
    limit: int | Placeholder | None = None
    if limit_kind == "int":
        limit = draw(st.integers(0, INT_MAX))
    elif limit_kind == "placeholder":
        limit = numbering.take()
    return Query(predicate, order_by, limit)
