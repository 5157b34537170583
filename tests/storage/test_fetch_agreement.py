"""Random predicates over random data: ``sort_rows`` and every engine's ``fetch`` agree.

Each example writes random rows to a collection of its own on every engine (memory, LMDB
and, when there is a server, PostgreSQL, all opened once per test), then updates and
tombstones some of them (so the engines' index maintenance is exercised), then checks
that each engine's ``fetch`` returns exactly ``sort_rows`` over the rows as written — the
same ids in the same order — for random queries. Values cover the whole value model:
negative numbers, ints and floats around float64's limits, NaN, strings with NUL, bytes,
nulls, missing fields, lists and nested objects reached by dotted paths.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mycelia.errors import InvalidArgument
from mycelia.proto import EntityId
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
    resolve_path,
    sort_rows,
)
from mycelia.proto.query.syntax import check_literal
from mycelia.retrieval import StoredState, WriteBatch
from mycelia.storage.testing import EngineSpec, genesis, state_of
from mycelia.storage.testing_queries import fetch_matches_scan
from tests.proto.query import strategies as qs
from tests.storage.conftest import PostgresSchemas, lmdb_spec, memory_spec

T = TypeVar("T")
Model = dict[EntityId, Mapping[str, object]]

# -- data ----------------------------------------------------------------------------------

LONG = "l" * 600
WIDE = "w" * 300
"""A field name too long for LMDB's plain index prefix."""

# Small values come first (hypothesis favours early branches) so that predicates select
# some rows; the whole value model follows, mapped so one_of does not flatten it.
_SCALARS = st.one_of(
    st.integers(-5, 5),
    st.sampled_from([-1.5, -0.0, 0.5, 2.0, 1e300, -1e-300, True, False]),
    st.sampled_from(["", "a", "b", "a\x00", "é"]),
    st.sampled_from([LONG, LONG + "a", LONG + "\x00", "l" * 1500]),  # past index key limits
    st.integers(-5, 5),
    qs.scalars.map(lambda v: v),
)
_OBJECTS = st.fixed_dictionaries(
    {}, optional={"a": _SCALARS, "b": st.fixed_dictionaries({}, optional={"c": _SCALARS})}
)
_FIELD_VALUES = st.one_of(_SCALARS, _OBJECTS, qs.values.map(lambda v: v))
_ROW_FIELDS = {"x": _FIELD_VALUES, "order": _FIELD_VALUES}
_OPTIONAL = {"y": _FIELD_VALUES, "j": _OBJECTS, WIDE: _SCALARS}
rows = st.one_of(
    st.fixed_dictionaries(_ROW_FIELDS, optional=_OPTIONAL),
    st.fixed_dictionaries({}, optional={**_ROW_FIELDS, **_OPTIONAL}),
)
"""A row: the fields x, order (mostly present), y (any value), j (an object), WIDE."""

# -- queries -------------------------------------------------------------------------------

_PATHS = st.sampled_from(
    [("x",), ("x",), ("y",), ("order",), ("j", "a"), ("j", "b", "c"), ("missing",), ("j",), (WIDE,)]
)
_LITERALS = st.one_of(
    st.integers(-5, 5),
    st.sampled_from([-1.5, 0.5, 2.0, "", "a", "b", True, False]),
    qs.literals.filter(lambda v: not isinstance(v, Placeholder)),
)
_ORDERS = st.lists(st.builds(OrderKey, _PATHS, st.booleans()), max_size=2).map(tuple)
_LIMITS = st.none() | st.integers(0, 6)


def data_literals(rows: list[dict[str, object]]) -> st.SearchStrategy[object]:
    """Literals, half of them the rows' own non-null values (so predicates select rows)."""
    found = [
        value
        for row in rows
        for path in [("x",), ("y",), ("order",), ("j", "a"), ("j", "b", "c"), (WIDE,)]
        if _is_literal(value := resolve_path(row, path))
    ]
    return st.one_of(st.sampled_from(found), _LITERALS) if found else _LITERALS


def _is_literal(value: object) -> bool:
    try:
        return check_literal(value) is not None
    except InvalidArgument:
        return False


def predicates(literals: st.SearchStrategy[object]) -> st.SearchStrategy[Predicate]:
    """Random predicates over the test's paths: every node type, nested."""
    leaves: st.SearchStrategy[Predicate] = st.one_of(
        st.builds(Comparison, _PATHS, st.sampled_from(Op), literals),
        st.builds(In, _PATHS, st.lists(literals, max_size=3).map(tuple), st.booleans()),
        st.builds(IsNull, _PATHS, st.booleans()),
        st.builds(FieldComparison, _PATHS, st.sampled_from(Op), _PATHS),
        st.builds(Const, st.booleans()),
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, min_size=2, max_size=3).map(lambda items: And(tuple(items))),
            st.lists(inner, min_size=2, max_size=3).map(lambda items: Or(tuple(items))),
            inner.map(Not),
        ),
        max_leaves=5,
    )


@st.composite
def indexable_queries(draw: st.DrawFn, literals: st.SearchStrategy[object]) -> Query:
    """A query the planner can push down: range or IN conjuncts on one top-level field,
    often the ORDER BY field (the early-stopping walk), sometimes ANDed with anything."""
    field = draw(st.sampled_from(["x", "y", "order", WIDE]))
    ops = st.sampled_from([Op.EQ, Op.LT, Op.LE, Op.GT, Op.GE])
    conjuncts: list[Predicate] = [
        draw(
            st.builds(Comparison, st.just((field,)), ops, literals)
            | st.builds(
                In, st.just((field,)), st.lists(literals, min_size=1, max_size=3).map(tuple)
            )
        )
        for _ in range(draw(st.sampled_from([1, 1, 2])))
    ]
    if draw(st.integers(0, 2)) == 0:
        conjuncts.append(draw(predicates(literals)))
    predicate = conjuncts[0] if len(conjuncts) == 1 else And(tuple(conjuncts))
    order = draw(st.sampled_from([((field,), False), ((field,), True), None]))
    order_by = (OrderKey(*order),) if order else draw(_ORDERS)
    return Query(predicate, order_by, draw(_LIMITS))


def queries(rows: list[dict[str, object]]) -> st.SearchStrategy[Query]:
    """Pushdown-shaped and arbitrary queries, with literals near ``rows``."""
    literals = data_literals(rows)
    anything = st.builds(Query, predicates(literals), _ORDERS, _LIMITS)
    return st.one_of(indexable_queries(literals), anything)


# -- the engines ----------------------------------------------------------------------------


class Engines:
    """Engines opened once, on one event loop, for every example of a test."""

    def __init__(self, specs: list[EngineSpec]) -> None:
        self.loop = asyncio.new_event_loop()
        self.named = [(spec.name, self.run(spec.fresh())) for spec in specs]
        self.collections = itertools.count()

    def run(self, work: Awaitable[T]) -> T:
        return self.loop.run_until_complete(work)

    def write(self, states: list[StoredState]) -> None:
        for _, engine in self.named:
            self.run(engine.write(WriteBatch(states=tuple(states))))

    def check(self, collection: str, query: Query, model: Model) -> None:
        wanted = [i for i, _ in sort_rows(model.items(), query)]
        for name, engine in self.named:
            got = self.run(fetch_matches_scan(engine, collection, query, name=name))
            assert got == wanted, f"{name}: fetch({query}) differs from sort_rows"

    def close(self) -> None:
        for _, engine in self.named:
            self.run(engine.close())
        self.loop.close()


def run_examples(engines: Engines, *, max_examples: int | None = None) -> None:
    """Run the property on ``engines`` (by default 150 examples, or the profile's if more)."""
    examples = max(settings().max_examples, 150) if max_examples is None else max_examples

    @settings(suppress_health_check=[HealthCheck.too_slow], deadline=None, max_examples=examples)
    @given(
        initial=st.lists(rows, max_size=16),
        changes=st.lists(st.tuples(st.integers(0, 15), rows | st.none()), max_size=6),
        data=st.data(),
    )
    def example(
        initial: list[dict[str, object]],
        changes: list[tuple[int, dict[str, object] | None]],
        data: st.DataObject,
    ) -> None:
        collection = f"c{next(engines.collections)}"
        states = [state_of([genesis(collection, n)], v) for n, v in enumerate(initial)]
        engines.write(states)
        model: Model = {s.state.entity_id: s.values for s in states}
        changed = []
        for n, values in changes:
            if n < len(states):
                old = states[n].values
                new = {**old, "_deleted": True} if values is None else values
                changed.append(state_of([genesis(collection, n)], new))
        engines.write(changed)  # one batch: an entity changed twice keeps the last
        model.update({s.state.entity_id: s.values for s in changed})
        current = [dict(values) for values in model.values()]
        for query in data.draw(st.lists(queries(current), min_size=1, max_size=4)):
            engines.check(collection, query, model)
            live = Query(And((query.predicate, IsNull(("_deleted",)))), query.order_by, query.limit)
            engines.check(collection, live, model)

    example()


def test_memory_and_lmdb_fetch_agree_with_sort_rows(tmp_path: Path) -> None:
    engines = Engines([memory_spec(), lmdb_spec(tmp_path, map_size=1 << 26)])
    try:
        run_examples(engines)
    finally:
        engines.close()


@pytest.mark.postgres
def test_memory_lmdb_and_postgres_fetch_agree_with_sort_rows(
    tmp_path: Path, pg_schemas: PostgresSchemas
) -> None:
    specs = [memory_spec(), lmdb_spec(tmp_path, map_size=1 << 26), pg_schemas.spec()]
    engines = Engines(specs)
    try:
        run_examples(engines)
    finally:
        engines.close()


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(1800)
def test_engines_fetch_agree_in_a_long_run(tmp_path: Path, pg_schemas: PostgresSchemas) -> None:
    specs = [memory_spec(), lmdb_spec(tmp_path, map_size=1 << 26), pg_schemas.spec()]
    engines = Engines(specs)
    try:
        run_examples(engines, max_examples=2000)
    finally:
        engines.close()
