"""The index planner (mycelia.storage.plan): which ranges stand in for a scan, exactly."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mycelia.proto.query import In, Op, Query, encode_key, holds, parse
from mycelia.proto.query.keys import TAG_NUMBER
from mycelia.storage.plan import LONG, IndexPlan, KeyRange, index_entries, plan_query, successor
from tests.proto.query.strategies import literals, scalars


def plan(text: str, *args: object) -> IndexPlan | None:
    return plan_query(parse(text).bind(*args))


def covers(found: IndexPlan, value: object) -> bool:
    """Whether ``value``'s index entry lies in the plan's ranges (False if it has none)."""
    entries = index_entries({"x": value})
    return "x" in entries and any(r.low <= entries["x"] < r.high for r in found.ranges)


def test_a_range_stays_inside_the_class_of_its_literal() -> None:
    found = plan("x > 5")
    assert found is not None
    assert found.ranges == (KeyRange(successor(encode_key(5)), bytes([TAG_NUMBER + 1])),)
    assert not covers(found, "6")
    assert not covers(found, True)
    assert covers(found, 5.5)
    assert not covers(found, 5.0)


def test_equality_and_in_read_points_and_nulls_never_match() -> None:
    found = plan("x IN (1, 1.0, NULL, 'a')")
    assert found is not None
    assert [r.point for r in found.ranges] == [True, True]
    assert plan("x = NULL") == IndexPlan("x", ())
    assert plan("x IN (NULL)") == IndexPlan("x", ())
    assert plan("x < FALSE") == IndexPlan("x", ())
    assert plan("x > 0 AND FALSE") == IndexPlan("", ())


def test_conjuncts_on_one_field_intersect() -> None:
    found = plan("x > 5 AND y = 1 AND x <= 9 ORDER BY x DESC LIMIT 3")
    assert found is not None
    assert (found.field, found.ordered, found.descending) == ("x", True, True)
    assert [covers(found, v) for v in (5, 6, 9, 9.5, "7")] == [False, True, True, False, False]
    assert plan("x > 5 AND x < 3") == IndexPlan("x", ())
    both = plan("x IN (1, 2, 3) AND x >= 2")
    assert both is not None
    assert [r.point for r in both.ranges] == [True, True]


def test_the_order_field_wins_only_with_a_limit() -> None:
    with_limit = plan("y = 1 AND x > 0 ORDER BY x LIMIT 20")
    without = plan("y = 1 AND x > 0 ORDER BY x")
    assert with_limit is not None
    assert without is not None
    assert (with_limit.field, with_limit.ordered) == ("x", True)
    assert (without.field, without.ordered) == ("y", False)


def test_unindexable_predicates_have_no_plan() -> None:
    for text in ["", "x != 1", "x NOT IN (1)", "x IS NULL", "NOT x > 1", "x > 1 OR y = 2",
                 "j.k = 1", "x = y"]:  # fmt: skip
        assert plan(text) is None, text


@given(op=st.sampled_from([op for op in Op if op is not Op.NE]), literal=literals, value=scalars)
def test_a_comparison_holds_exactly_for_the_values_its_ranges_cover(
    op: Op, literal: object, value: object
) -> None:
    if not isinstance(literal, bool | int | float | str | bytes):
        return  # None (no ranges: checked above) or the strategies' placeholder mark
    text = f"x {op.value} ?"
    found = plan_query(parse(text).bind(literal))
    assert found is not None
    assert covers(found, value) == holds(op, value, literal)


@given(items=st.lists(literals, max_size=4), value=scalars)
def test_an_in_holds_exactly_for_the_values_its_points_cover(
    items: list[object], value: object
) -> None:
    bound = [v for v in items if isinstance(v, bool | int | float | str | bytes | None)]
    found = plan_query(Query(In(("x",), tuple(bound))))
    assert found is not None
    assert covers(found, value) == any(holds(Op.EQ, value, v) for v in bound)


def test_index_entries_are_the_keys_of_the_indexed_values_whatever_was_cached_before() -> None:
    values: list[object] = [1, 1.0, True, 0.0, -0.0, float("nan"), "1", b"1", None, [1], {}]
    for order in (values, list(reversed(values))):
        for value in order:
            entries = index_entries({"x": value})
            if isinstance(value, list | dict) or value is None or value != value:
                assert entries == {}, value
            else:
                assert entries == {"x": encode_key(value)}, value
    assert index_entries({"x": True}) != index_entries({"x": 1})
    assert index_entries({"x": "l" * 100}) == {"x": encode_key("l" * 100)}


@given(st.text(max_size=12) | st.binary(max_size=12), st.integers(1, 40))
def test_a_key_surely_longer_than_longest_is_long_and_any_other_is_exact(
    value: str | bytes, longest: int
) -> None:
    """With ``longest``, a string or bytes value gets LONG only when its key would be
    longer; otherwise its exact key (which an engine still measures: a multi-byte text
    may be longer than its length says)."""
    key = encode_key(value)
    entry = index_entries({"x": value, "n": 1}, longest=longest)
    assert entry["n"] == encode_key(1)
    if entry["x"] == LONG:
        assert len(key) > longest
    else:
        assert entry["x"] == key
    assert index_entries({"x": value}) == {"x": key}  # without longest: always exact


def test_a_long_text_is_long_without_its_key() -> None:
    text = "é" * 1_000_000
    assert index_entries({"body": text}, longest=511) == {"body": LONG}
    assert all(encode_key(v) != LONG for v in ("", b"", 0, False))  # no real key is empty
