"""Compiled predicates agree with evaluate() on every predicate and row."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import mycelia.proto.query.compile as compiled_module
from mycelia.errors import InvalidArgument
from mycelia.proto.query import Predicate, Query, evaluate, parse
from mycelia.proto.query.compile import compile_predicate
from mycelia.proto.query.syntax import iter_placeholders
from tests.proto.query.strategies import predicates, values

rows = st.dictionaries(st.sampled_from(["x", "year", "order", "a_b"]), values, max_size=4)


@given(predicate=predicates, row=rows)
def test_a_compiled_predicate_agrees_with_evaluate(
    predicate: Predicate, row: dict[str, object]
) -> None:
    if any(True for _ in iter_placeholders(predicate)):
        with pytest.raises(InvalidArgument):
            compile_predicate(predicate)  # compiling needs a bound predicate, always
        return
    try:
        expected = evaluate(predicate, row)
    except InvalidArgument:
        return  # an unbound placeholder or a value outside the model: evaluate refuses
    assert compile_predicate(predicate)(row) == expected


@pytest.mark.parametrize(
    ("text", "row", "expected"),
    [
        ("x > 1", {"x": 2}, True),
        ("x > 1", {"x": True}, False),  # a bool is not a number
        ("x = 1", {"x": 1.0}, True),  # numbers by value across int and float
        ("x = 1", {"x": True}, False),
        ("x != 1", {"x": "1"}, True),  # across classes
        ("x != 1", {}, False),  # null
        ("x < 'b'", {"x": "a"}, True),
        ("x >= X'01'", {"x": b"\x02"}, True),
        ("x > 1", {"x": float("nan")}, False),  # NaN is null
        ("a.b = 2", {"a": {"b": 2}}, True),
        ("x IN (1, 'a') AND NOT y IS NULL", {"x": "a", "y": 0}, True),
    ],
)
def test_compiled_shapes(text: str, row: dict[str, object], expected: bool) -> None:
    query: Query = parse(text)
    assert compile_predicate(query.predicate)(row) is expected
    assert evaluate(query.predicate, row) is expected


@pytest.mark.parametrize(
    ("text", "row", "expected"),
    [
        ("x > 1 AND y IS NULL", {"x": 2}, True),
        ("x > 1 AND y IS NULL", {"x": 2, "y": float("nan")}, True),  # NaN is null
        ("x > 1 AND y IS NULL", {"x": 2, "y": ""}, False),
        ("x > 1 AND y IS NOT NULL", {"x": 2, "y": [None]}, True),
        ("x > 1 AND y IS NOT NULL", {"x": 2, "y": False}, True),
    ],
)
def test_is_null_and_a_pair_of_tests_never_fall_back_to_evaluate(
    text: str, row: dict[str, object], expected: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every read path ANDs "not deleted" (an IS NULL) to its query: that test went
    # through the reference evaluator, a tree walk and a class dispatch per row read.
    compiled = compile_predicate(parse(text).predicate)

    def refuse(*_: object) -> bool:
        raise AssertionError("fell back to evaluate()")

    monkeypatch.setattr(compiled_module, "evaluate", refuse)
    assert compiled(row) is expected
