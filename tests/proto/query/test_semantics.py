"""Evaluation semantics and the in-memory executor (the package docstring is the spec)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mycelia.errors import InvalidArgument
from mycelia.proto.query import (
    Comparison,
    In,
    Not,
    Op,
    Predicate,
    Query,
    evaluate,
    holds,
    parse,
    sort_rows,
)
from tests.proto.query.strategies import predicates, values

ROW: Mapping[str, object] = {
    "year": 1986,
    "neg": -5,
    "rating": 4.5,
    "name": "Parade",
    "flag": True,
    "nothing": None,
    "nan": float("nan"),
    "raw": b"\x01\x02",
    "tags": ["a", "b"],
    "meta": {"author": {"name": "Ann"}, "pages": 12, "list": [1]},
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("year = 1986", True),
        ("year = 1986.0", True),
        ("year != 1986", False),
        ("year > 1985.5 AND year < 1986.5", True),
        ("neg < 0 AND neg > -6 AND neg = -5.0", True),
        ("rating >= 4.5 AND rating <= 4.5", True),
        ("name = 'Parade'", True),
        ("name > 'P' AND name < 'Q'", True),
        ("flag = TRUE AND flag > FALSE", True),
        ("flag = 1", False),
        ("flag != 1", True),
        ("year = '1986'", False),
        ("year != '1986'", True),
        ("year < 'z'", False),
        ("year >= 'a'", False),
        ("raw = X'0102' AND raw > X'01'", True),
        ("raw = '\\u0001\\u0002'", False),
        ("missing = 1", False),
        ("missing != 1", False),
        ("missing < 1 OR missing > 1", False),
        ("NOT missing = 1", True),
        ("NOT (missing != 1)", True),
        ("nothing = NULL", False),
        ("nothing != NULL", False),
        ("year = NULL OR year != NULL", False),
        ("nan = nan OR nan != 1", False),
        ("nan IS NULL AND nothing IS NULL AND missing IS NULL", True),
        ("year IS NOT NULL AND NOT year IS NULL", True),
        ("missing IN (1, NULL)", False),
        ("missing NOT IN (1, NULL)", True),
        ("year IN (1, 1986.0)", True),
        ("year NOT IN (1, 1986.0)", False),
        ("year IN ()", False),
        ("year NOT IN ()", True),
        ("meta.author.name = 'Ann'", True),
        ("meta.pages > 10", True),
        ("meta.author.name.first IS NULL", True),
        ("meta.list.x IS NULL AND name.x IS NULL AND tags.a IS NULL", True),
        ("meta.nope IS NULL AND missing.deeper IS NULL", True),
        ("tags = tags AND meta = meta", True),
        ("tags < meta OR tags > meta", False),
        ("tags != meta", True),
        ("year < rating OR year = rating", False),
        ("rating < year", True),
        ("name > year", False),
        ("TRUE AND NOT FALSE", True),
    ],
)
def test_predicates_follow_the_documented_semantics(text: str, expected: bool) -> None:
    assert evaluate(parse(text).predicate, ROW) is expected


def test_not_in_is_exactly_not_of_in() -> None:
    rows: list[dict[str, object]] = [{"x": 1}, {"x": 3}, {"x": None}, {}, {"x": "1"}]
    for row in rows:
        inside = evaluate(parse("x IN (1, 2)").predicate, row)
        assert evaluate(parse("x NOT IN (1, 2)").predicate, row) is not inside
        assert evaluate(parse("NOT x IN (1, 2)").predicate, row) is not inside


def test_is_null_on_a_json_path_is_safe() -> None:
    predicate = parse("a.b.c IS NULL").predicate
    rows: list[dict[str, object]] = [
        {},
        {"a": None},
        {"a": 5},
        {"a": {"b": []}},
        {"a": {"b": {"c": None}}},
    ]
    for row in rows:
        assert evaluate(predicate, row) is True
    assert evaluate(predicate, {"a": {"b": {"c": 0}}}) is False


@pytest.mark.parametrize("op", list(Op))
@given(left=values, right=values)
def test_comparisons_with_null_are_false(op: Op, left: object, right: object) -> None:
    assert holds(op, None, right) is False
    assert holds(op, left, None) is False
    assert holds(op, float("nan"), right) is False


@given(left=values, right=values)
def test_ne_is_the_negation_of_eq_among_non_null_values(left: object, right: object) -> None:
    if left is None or right is None:
        return
    if (isinstance(left, float) and left != left) or (isinstance(right, float) and right != right):
        return
    assert holds(Op.NE, left, right) is not holds(Op.EQ, left, right)
    assert holds(Op.LT, left, right) == holds(Op.GT, right, left)
    assert holds(Op.LE, left, right) == holds(Op.GE, right, left)


@given(predicate=predicates, row=st.dictionaries(st.sampled_from(["x", "year", "order"]), values))
def test_not_negates_and_unbound_placeholders_are_refused_by_the_executor(
    predicate: Predicate, row: dict[str, object]
) -> None:
    if Query(predicate).placeholders:
        # Evaluation may or may not reach the ``?`` (short-circuits); binding is required.
        with pytest.raises(InvalidArgument, match="unbound"):
            sort_rows([(b"id", row)], Query(predicate))
        return
    assert evaluate(Not(predicate), row) is not evaluate(predicate, row)


@given(
    predicate=predicates,
    row=st.dictionaries(st.sampled_from(["x", "year", "order", "other"]), values),
    field=st.sampled_from(["x", "year", "order", "other", "unrelated"]),
    new_value=values,
)
def test_changing_a_field_outside_fields_never_changes_the_match(
    predicate: Predicate, row: dict[str, object], field: str, new_value: object
) -> None:
    # A live query re-evaluates a row only when a field in query.fields() changed; the
    # reference missed new matches for IN, NOT and literal-on-the-left predicates.
    query = Query(predicate).bind(*([0] * Query(predicate).placeholders))
    if field in query.fields():
        return
    before = evaluate(query.predicate, row)
    assert evaluate(query.predicate, {**row, field: new_value}) is before


@pytest.mark.parametrize(
    "text",
    ["year IN (1990, 2000)", "year NOT IN (1990, 2000)", "NOT year = 1990", "1995 < year"],
)
def test_rows_written_later_match_like_rows_fetched_at_the_start(text: str) -> None:
    query = parse(text)
    assert query.fields() == {"year"}
    live: set[bytes] = set()
    rows: dict[bytes, dict[str, object]] = {}
    for index, year in enumerate([1980, 1990, None, 2000, 1999, 2001]):
        row_id = bytes([index]) * 32
        rows[row_id] = {"year": year} if year is not None else {}
        if evaluate(query.predicate, rows[row_id]):
            live.add(row_id)
    assert live == {row_id for row_id, _ in sort_rows(rows.items(), query)}
    assert live  # every query here matches some of the new rows


def _ids(result: list[tuple[bytes, Mapping[str, object]]]) -> list[int]:
    return [row_id[0] for row_id, _ in result]


ROWS: list[tuple[bytes, Mapping[str, object]]] = [
    (bytes([1]) * 32, {"n": 5}),
    (bytes([2]) * 32, {"n": -3}),
    (bytes([3]) * 32, {}),
    (bytes([4]) * 32, {"n": 0.5}),
    (bytes([5]) * 32, {"n": -3.0}),
    (bytes([6]) * 32, {"n": None}),
    (bytes([7]) * 32, {"n": -(2**63)}),
]


def test_sort_rows_orders_negatives_before_positives_with_nulls_first() -> None:
    assert _ids(sort_rows(ROWS, parse("ORDER BY n"))) == [3, 6, 7, 2, 5, 4, 1]
    assert _ids(sort_rows(ROWS, parse("ORDER BY n DESC"))) == [1, 4, 2, 5, 7, 3, 6]
    assert _ids(sort_rows(reversed(ROWS), parse("ORDER BY n DESC"))) == [1, 4, 2, 5, 7, 3, 6]


def test_sort_rows_applies_the_limit_after_ordering() -> None:
    assert _ids(sort_rows(ROWS, parse("n < 1 ORDER BY n LIMIT 2"))) == [7, 2]
    assert _ids(sort_rows(ROWS, parse("n < 1 ORDER BY n DESC LIMIT ?").bind(2))) == [4, 2]
    assert _ids(sort_rows(ROWS, parse("LIMIT 3"))) == [1, 2, 3]
    assert sort_rows(ROWS, parse("LIMIT 0")) == []


def test_sort_rows_without_order_by_returns_id_order() -> None:
    assert _ids(sort_rows(reversed(ROWS), parse("n IS NOT NULL"))) == [1, 2, 4, 5, 7]


def test_sort_rows_refuses_an_unbound_query() -> None:
    with pytest.raises(InvalidArgument, match="unbound"):
        sort_rows(ROWS, parse("n = ?"))
    with pytest.raises(InvalidArgument, match="unbound"):
        evaluate(Comparison(("n",), Op.EQ, parse("n = ?").predicate.value), {"n": 1})  # type: ignore[union-attr]


def test_in_with_a_placeholder_list_item_is_refused_until_bound() -> None:
    predicate = parse("n IN (1, ?)").predicate
    assert isinstance(predicate, In)
    with pytest.raises(InvalidArgument, match="unbound"):
        evaluate(predicate, {"n": 2})
