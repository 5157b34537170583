"""encode_key against a reference comparator written independently of the implementation."""

from __future__ import annotations

import math
from fractions import Fraction
from functools import cmp_to_key
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mycelia.errors import InvalidArgument
from mycelia.proto.ids import EntityId
from mycelia.proto.query import OrderKey, compare_values, encode_key, invert_key, order_key
from tests.proto.query.strategies import scalars, values


def _rank(value: object) -> int:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return 0
    if isinstance(value, bool):
        return 1 + int(value)
    ranks = {int: 3, float: 3, str: 4, bytes: 5, list: 6, tuple: 6, dict: 7}
    return next(rank for kind, rank in ranks.items() if isinstance(value, kind))


def _number(value: float) -> tuple[int, Fraction]:
    if math.isinf(value):
        return (1 if value > 0 else -1, Fraction(0))
    return (0, Fraction(value))


def _sign(left: Any, right: Any) -> int:
    return int(left > right) - int(left < right)


def reference_compare(left: object, right: object) -> int:
    """The collation as the package docstring states it, by the most direct route."""
    left_rank, right_rank = _rank(left), _rank(right)
    if left_rank != right_rank or left_rank in (0, 1, 2):
        return _sign(left_rank, right_rank)
    if left_rank == 3:
        return _sign(_number(left), _number(right))  # type: ignore[arg-type]
    if left_rank == 4:
        return _sign([ord(c) for c in left], [ord(c) for c in right])  # type: ignore[attr-defined]
    if left_rank == 5:
        return _sign(list(left), list(right))  # type: ignore[call-overload]
    if left_rank == 7:
        left, right = sorted(left.items()), sorted(right.items())  # type: ignore[attr-defined]
    for left_item, right_item in zip(left, right, strict=False):  # type: ignore[call-overload]
        if left_rank == 7:
            order = reference_compare(left_item[0], right_item[0]) or reference_compare(
                left_item[1], right_item[1]
            )
        else:
            order = reference_compare(left_item, right_item)
        if order:
            return order
    return _sign(len(left), len(right))  # type: ignore[arg-type]


@given(values, values)
def test_key_bytes_order_is_the_collation(left: object, right: object) -> None:
    expected = reference_compare(left, right)
    assert _sign(encode_key(left), encode_key(right)) == expected
    assert compare_values(left, right) == expected


@given(scalars, scalars)
def test_scalar_keys_order_is_the_collation(left: object, right: object) -> None:
    assert _sign(encode_key(left), encode_key(right)) == reference_compare(left, right)


@given(values, values)
def test_no_key_is_a_proper_prefix_of_another(left: object, right: object) -> None:
    left_key, right_key = encode_key(left), encode_key(right)
    if left_key != right_key:
        assert not left_key.startswith(right_key)
        assert not right_key.startswith(left_key)


@given(st.lists(values, max_size=8))
def test_sorting_by_key_sorts_by_the_collation(items: list[object]) -> None:
    by_key = sorted(items, key=encode_key)
    by_reference = sorted(items, key=cmp_to_key(reference_compare))
    assert [encode_key(v) for v in by_key] == [encode_key(v) for v in by_reference]


@given(
    st.lists(st.tuples(values, values), min_size=2, max_size=2),
    st.lists(st.booleans(), min_size=2, max_size=2),
)
def test_concatenated_keys_sort_column_by_column_with_desc_inverted(
    rows: list[tuple[object, object]], descending: list[bool]
) -> None:
    order_by = [OrderKey(("a",), descending[0]), OrderKey(("b",), descending[1])]
    (a1, b1), (a2, b2) = rows
    keys = [order_key({"a": a, "b": b}, order_by) for a, b in rows]
    expected = reference_compare(a1, a2) * (-1 if descending[0] else 1)
    if expected == 0:
        expected = reference_compare(b1, b2) * (-1 if descending[1] else 1)
    assert _sign(keys[0], keys[1]) == expected


@pytest.mark.parametrize(
    ("left", "right"),
    [
        (1, 1.0),
        (0, -0.0),
        (0.0, -0.0),
        (2**53, 2.0**53),
        (2**63, 2.0**63),
        (float("nan"), None),
        ([1, float("nan")], (1.0, None)),
        (b"id", bytearray(b"id")),
        ({"b": 1, "a": 2}, {"a": 2.0, "b": 1}),
    ],
)
def test_equal_values_have_identical_keys(left: object, right: object) -> None:
    assert encode_key(left) == encode_key(right)


def test_negative_integers_sort_before_positive_ones() -> None:
    numbers = [5, -1, 0, -100, 2**62, -(2**63), 2**63 - 1, -2.5, 3.25, -(2**53) - 1]
    assert sorted(numbers, key=encode_key) == sorted(numbers)
    assert encode_key(-1) < encode_key(0) < encode_key(1)
    assert encode_key(-(2**63)) < encode_key(-1.5) < encode_key(-1)


def test_integers_beyond_float_precision_keep_their_exact_order() -> None:
    assert encode_key(2**53 + 1) > encode_key(2.0**53)
    assert encode_key(2**53 - 1) < encode_key(2.0**53)
    assert encode_key(2**63 - 1) < encode_key(2.0**63) < encode_key(2**63 + 1)
    assert encode_key(float("-inf")) < encode_key(-(2**63)) < encode_key(2**64 - 1)
    assert encode_key(2**64 - 1) < encode_key(float("inf"))


def test_the_classes_sort_in_collation_order() -> None:
    ordered: list[object] = [
        None,
        False,
        True,
        float("-inf"),
        -1,
        0,
        2.5,
        "",
        "a",
        b"",
        b"a",
        [],
        [None],
        {},
    ]
    keys = [encode_key(value) for value in ordered]
    assert keys == sorted(keys)
    assert len(set(keys)) == len(keys)


def test_ids_are_keyed_as_their_bytes() -> None:
    raw = bytes(range(32))
    assert encode_key(EntityId(raw)) == encode_key(raw)


def test_strings_with_nuls_sort_by_code_point() -> None:
    texts = ["a\x00b", "a", "a\x00", "ab", "\x00", "", "é", "z", "\U0001f600", "\uffff"]
    assert sorted(texts, key=encode_key) == sorted(texts)


def test_inverted_keys_sort_in_reverse() -> None:
    items = [None, -1, 3, "a", "ab", b"\x00", [1], {"k": None}]
    assert sorted(items, key=lambda v: invert_key(encode_key(v))) == list(reversed(items))


@pytest.mark.parametrize(
    "value",
    [2**64, -(2**63) - 1, object(), {1: "non-str key"}, {1, 2}, [complex(1)]],
)
def test_values_outside_the_model_are_refused(value: object) -> None:
    with pytest.raises(InvalidArgument):
        encode_key(value)


def test_nesting_deeper_than_the_limit_is_refused() -> None:
    deep: object = 0
    for _ in range(100):
        deep = [deep]
    with pytest.raises(InvalidArgument, match="nests deeper"):
        encode_key(deep)
    with pytest.raises(InvalidArgument, match="nests deeper"):
        compare_values(deep, deep)
