"""Conformance of ``fetch`` (ARCHITECTURE.md §6, §8), as library code like the rest of
:mod:`mycelia.storage.testing`.

The contract: ``engine.fetch(collection, query)`` returns exactly what ``sort_rows`` over
``engine.scan(collection)`` returns — the same rows, in the same order, LIMIT applied —
for every bound query, after any sequence of writes (so index maintenance on overwrite
and on tombstoning is part of it). :func:`check_fetch` pins it on fixed data chosen for
the hard cases (negative numbers, ints vs floats at float64's limits, every collation
class in one field, NaN, nulls and missing fields, dotted paths, ties under DESC + LIMIT,
rows updated, deleted and written twice in one batch); :func:`fetch_queries` draws
random queries for the differential machine.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace

from hypothesis import strategies as st

from mycelia.proto import EntityId
from mycelia.proto.query import (
    After,
    And,
    Comparison,
    In,
    IsNull,
    Not,
    Op,
    Or,
    OrderKey,
    Placeholder,
    Predicate,
    Query,
    parse,
    sort_rows,
)
from mycelia.retrieval import StoredState, WriteBatch
from mycelia.storage.engine import StorageEngine, encode_values
from mycelia.storage.testing_data import genesis, state_of

__all__ = [
    "FETCH_QUERIES",
    "FETCH_ROWS",
    "check_fetch_on",
    "fetch_matches_scan",
    "fetch_pages",
    "fetch_queries",
]

_LONG = "l" * 600
_LONGER = "l" * 1500
_LONG_FIELD = "f" * 300

FETCH_ROWS: tuple[dict[str, object], ...] = (
    {"x": 1, "s": "a", "t": 6, "j": {"k": 1}},
    {"x": -1.5, "s": "b", "t": 7, "j": {"k": -2}},
    {"x": 1.0, "s": "a", "t": 8},
    {"x": 2**53 + 1, "s": "é", "t": 6},
    {"x": 2.0**53, "s": "", "t": 7, "j": {"k": "1"}},
    {"x": None, "s": "a\0", "t": 8},
    {"x": "1", "t": 6},
    {"x": b"\0", "s": "b", "t": 7},
    {"x": [1], "s": "c", "t": 8},
    {"x": {"k": 1}, "t": 6, "j": []},
    {"x": -0.0, "s": "a", "t": 7},
    {"x": float("inf"), "t": 8},
    {"x": False, "s": "d", "t": 6},
    {"x": True, "t": 7},
    {"x": -(2**63), "t": 8},
    {"x": 2**64 - 1, "t": 6},
    {"x": float("nan"), "s": "n", "t": 7},
    {"x": 0, "s": "z", "t": 7, "_deleted": True},
    {},
    {"x": 7, "t": 7, "j": {"k": {"deep": 1}}},
    {"x": _LONG, "s": "a", "t": 7},  # keys too long for some indexes
    {"x": _LONG, "t": 8},
    {"x": _LONG + "a", "s": _LONGER, "t": 7},
    {"x": _LONGER, "t": 6, _LONG_FIELD: 1},
    {"x": "m", "t": 7, _LONG_FIELD: 2},
)
"""The rows :func:`check_fetch_on` writes (entity ``n`` of the collection is row ``n``)."""

_UPDATES: tuple[tuple[int, dict[str, object]], ...] = (
    (0, {"x": 5, "s": "a", "t": 6}),  # moves within the number class
    (1, {"s": "b", "t": 7}),  # loses x
    (2, {"x": "now a string", "t": 8}),  # changes class
    (3, {**FETCH_ROWS[3], "_deleted": True}),  # tombstoned
    (5, {"x": 3, "s": "a\0", "t": 8}),  # null to number
    (7, {"x": b"\0", "s": "b", "t": 8}),  # into another tie group
    (17, {"x": 0, "s": "z", "t": 7}),  # tombstone lifted
    (10, {"x": 100, "t": 7}),  # written twice in one batch: the second wins
    (10, {"x": -100, "s": "a", "t": 7}),
    (20, {"x": "short", "t": 7}),  # long to short
    (19, {"x": _LONG + "b", "t": 7}),  # short to long
    (22, {"x": _LONG + "a", "t": 8}),  # long to long, longer to short
)

FETCH_QUERIES: tuple[str, ...] = (
    "",
    "x > 0 ORDER BY x LIMIT 3",
    "x > 0 ORDER BY x DESC LIMIT 3",
    "x >= -1.5 AND x < 2 ORDER BY x",
    "x <= 1 ORDER BY x DESC",
    "x = 1",
    "x = 1.0 ORDER BY s DESC",
    "x != 1 ORDER BY x",
    "x IN (1, 'a', TRUE, NULL, 7) ORDER BY x DESC LIMIT 2",
    "x NOT IN (1) ORDER BY x",
    "s < 'b' ORDER BY s, x DESC LIMIT 4",
    "s >= '' ORDER BY s DESC LIMIT 2",
    "x < TRUE ORDER BY x",
    "x >= FALSE ORDER BY x DESC",
    "x = NULL",
    "x > X'' ORDER BY x",
    "j.k = 1",
    "j.k > -5 ORDER BY j.k DESC",
    "x IS NULL ORDER BY s",
    "NOT x > 0 ORDER BY x LIMIT 5",
    "x > 0 OR s = 'a' ORDER BY x",
    "t = 7 ORDER BY t DESC LIMIT 2",
    "t >= 7 ORDER BY t DESC LIMIT 4",
    "t > 6 AND x > 0 ORDER BY t LIMIT 3",
    "x > 0 LIMIT 2",
    "x > 0 LIMIT 0",
    "FALSE OR x = 7",
    "x > 0 AND FALSE",
    "x > 9.5E18 ORDER BY x DESC",
    "x > -9223372036854775808 ORDER BY x LIMIT 2",
    "x > 'l' ORDER BY x LIMIT 3",
    "x >= 'l' ORDER BY x DESC LIMIT 4",
    "x < 'm' AND x > 'a' ORDER BY x DESC",
    f"x = '{_LONG}' ORDER BY t DESC",
    f"x IN ('{_LONGER}', 'm', 7) ORDER BY x DESC LIMIT 2",
    f"s >= '{_LONG}' ORDER BY s LIMIT 1",
    f"{_LONG_FIELD} > 0 ORDER BY {_LONG_FIELD} DESC LIMIT 1",
    f"{_LONG_FIELD} IN (1, 2) ORDER BY {_LONG_FIELD}",
)
"""The queries :func:`check_fetch_on` runs, each also restricted to live rows."""


async def fetch_matches_scan(
    engine: StorageEngine,
    collection: str,
    query: Query,
    *,
    name: str = "engine",
    after: After | None = None,
) -> list[EntityId]:
    """Assert ``fetch`` (with ``after``) equals ``sort_rows`` over ``scan``: with ``after``,
    the rows of the whole ordered result that come after that position, up to the limit;
    returns the ids fetched."""
    fetched = await engine.fetch(collection, query, after=after)
    scanned = {s.state.entity_id: s for s in await engine.scan(collection)}
    rows = ((i, s.values) for i, s in scanned.items())
    expected = sort_rows(rows, replace(query, limit=None))
    if after is not None:
        expected = [(i, v) for i, v in expected if After.row(query, i, v) > after]
    wanted = [entity_id for entity_id, _ in expected][: _limit(query)]
    got = [s.state.entity_id for s in fetched]
    assert got == wanted, (
        f"{name}: fetch({query}, after={after!r}) gave {_short(got)}, expected {_short(wanted)}"
    )
    for stored in fetched:
        assert _same(stored, scanned[stored.state.entity_id]), f"{name}: fetch changed a row"
    return got


def _limit(query: Query) -> int | None:
    assert not isinstance(query.limit, Placeholder)
    return query.limit


async def fetch_pages(
    engine: StorageEngine, collection: str, query: Query, *, size: int
) -> list[EntityId]:
    """The ids of ``query`` (no LIMIT) read ``size`` at a time by keyset paging, as a
    server streams an answer: each page's last row is the next ``after``."""
    ids: list[EntityId] = []
    after = None
    while True:
        page = await engine.fetch(collection, replace(query, limit=size), after=after)
        ids.extend(s.state.entity_id for s in page)
        if len(page) < size:
            return ids
        after = After.row(query, page[-1].state.entity_id, page[-1].values)


async def check_fetch_on(
    fresh: Callable[[], Awaitable[StorageEngine]],
    reopen: Callable[[StorageEngine], Awaitable[StorageEngine]] | None,
    *,
    name: str = "engine",
) -> None:
    """On an engine from ``fresh``, write :data:`FETCH_ROWS`, then updates and tombstones,
    running every query of :data:`FETCH_QUERIES` after each step (and after ``reopen``,
    when given); closes the engine."""
    engine = await fresh()
    try:
        rows = [state_of([genesis("items", n)], dict(v)) for n, v in enumerate(FETCH_ROWS)]
        others = [state_of([genesis("others", n)], {"x": n, "t": 7}) for n in range(3)]
        await engine.write(WriteBatch(states=(*rows, *others)))
        model = {row.state.entity_id: row.values for row in rows}
        await _run_queries(engine, name, model)
        updated = [state_of([genesis("items", n)], values) for n, values in _UPDATES]
        await engine.write(WriteBatch(states=tuple(updated)))
        model.update({row.state.entity_id: row.values for row in updated})
        await _run_queries(engine, name, model)
        if reopen is not None:
            engine = await reopen(engine)
            await _run_queries(engine, f"{name} (reopened)", model)
    finally:
        await engine.close()


async def _run_queries(
    engine: StorageEngine, name: str, model: dict[EntityId, Mapping[str, object]]
) -> None:
    middle = sorted(model)[len(model) // 2]
    for text in FETCH_QUERIES:
        query = parse(text)
        live = Query(_and(query.predicate, IsNull(("_deleted",))), query.order_by, query.limit)
        for each in (query, live):
            got = await fetch_matches_scan(engine, "items", each, name=name)
            wanted = [i for i, _ in sort_rows(model.items(), each)]
            assert got == wanted, f"{name}: fetch({each}) does not match what was written"
            for position in _positions(each, middle, model):
                await fetch_matches_scan(engine, "items", each, name=name, after=position)
            if each.limit is None:
                paged = await fetch_pages(engine, "items", each, size=2)
                assert paged == got, f"{name}: fetch({each}) read in pages differs"


def _positions(
    query: Query, middle: EntityId, model: dict[EntityId, Mapping[str, object]]
) -> list[After]:
    """Positions to read ``query`` from: the middle row's, and a row's key with an id
    that is no row's (between rows of one key, or past them)."""
    values = model[middle]
    return [After.row(query, middle, values), After.row(query, bytes(32), values),
            After.row(query, b"\xff" * 32, values)]  # fmt: skip


def _and(left: Predicate, right: Predicate) -> Predicate:
    return And((left, right))


def _same(left: StoredState, right: StoredState) -> bool:
    # Compared as stored bytes: NaN values make dict equality useless.
    return left.state == right.state and encode_values(left.values) == encode_values(right.values)


def _short(ids: list[EntityId]) -> list[str]:
    return [bytes(i).hex()[:8] for i in ids]


_PATHS = st.sampled_from([("a",), ("b",), ("c",), ("a", "k")])
_LITERALS = (
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.floats(-3, 3, allow_nan=False)
    | st.sampled_from(["", "a", "b", "é"])
    | st.binary(max_size=2)
)
_LEAVES: st.SearchStrategy[Predicate] = st.one_of(
    st.builds(Comparison, _PATHS, st.sampled_from(Op), _LITERALS),
    st.builds(In, _PATHS, st.lists(_LITERALS, max_size=3).map(tuple), st.booleans()),
    st.builds(IsNull, _PATHS, st.booleans()),
)
_PREDICATES: st.SearchStrategy[Predicate] = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, min_size=2, max_size=3).map(lambda items: And(tuple(items))),
        st.lists(inner, min_size=2, max_size=3).map(lambda items: Or(tuple(items))),
        inner.map(Not),
    ),
    max_leaves=4,
)


def fetch_queries() -> st.SearchStrategy[Query]:
    """Bound queries over the fields ``a``, ``b``, ``c`` (and ``a.k``) that the
    differential machine's states carry: comparisons, IN, IS NULL, AND/OR/NOT, ORDER BY up
    to two columns either way, LIMIT 0..4 or none."""
    orders = st.lists(st.builds(OrderKey, _PATHS, st.booleans()), max_size=2).map(tuple)
    return st.builds(Query, _PREDICATES, orders, st.none() | st.integers(0, 4))
