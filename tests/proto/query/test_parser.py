"""The parser: precedence, literals, normalisation, limits, and errors with columns."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mycelia.errors import InvalidArgument, QueryError
from mycelia.proto.query import (
    MAX_DEPTH,
    MAX_QUERY_LENGTH,
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
    Query,
    parse,
)


def eq(path: str, value: object) -> Comparison:
    return Comparison(tuple(path.split(".")), Op.EQ, value)  # type: ignore[arg-type]


A, B, C = eq("a", 1), eq("b", 2), eq("c", 3)


@pytest.mark.parametrize(
    ("text", "predicate"),
    [
        ("a = 1 OR b = 2 AND c = 3", Or((A, And((B, C))))),
        ("a = 1 AND b = 2 OR c = 3", Or((And((A, B)), C))),
        ("NOT a = 1 AND b = 2", And((Not(A), B))),
        ("NOT a = 1 OR b = 2", Or((Not(A), B))),
        ("NOT (a = 1 OR b = 2)", Not(Or((A, B)))),
        ("(a = 1 OR b = 2) AND c = 3", And((Or((A, B)), C))),
        ("a = 1 AND (b = 2 AND c = 3)", And((A, And((B, C))))),
        ("a = 1 AND b = 2 AND c = 3", And((A, B, C))),
        ("NOT NOT a = 1", Not(Not(A))),
        ("a = 1 or b = 2 and not c = 3", Or((A, And((B, Not(C)))))),
    ],
)
def test_not_binds_tighter_than_and_which_binds_tighter_than_or(
    text: str, predicate: object
) -> None:
    assert parse(text).predicate == predicate


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("x = -5", -5),
        ("x = -2.5", -2.5),
        ("x = 1e3", 1000.0),
        ("x = -1.5E-2", -0.015),
        ("x = 0.1", 0.1),
        ("x = -0", 0),
        ("x = null", None),
        ("x = NULL", None),
        ("x = true", True),
        ("x = False", False),
        ("x = -9223372036854775808", -(2**63)),
        ("x = 9223372036854775807", 2**63 - 1),
        ("x = 'it''s'", "it's"),
        (r"x = 'it\'s'", "it's"),
        (r"x = 'a\\b\nc\td\r'", "a\\b\nc\td\r"),
        (r"x = '\u00e9\U0001F600'", "é\U0001f600"),
        ("x = 'multi\nline'", "multi\nline"),
        ("x = X'00Ff'", b"\x00\xff"),
        ("x = x''", b""),
    ],
)
def test_negative_decimal_null_and_escaped_literals_parse(text: str, value: object) -> None:
    predicate = parse(text).predicate
    assert isinstance(predicate, Comparison)
    assert predicate.value == value
    assert type(predicate.value) is type(value)


def test_not_in_is_negated_and_in_is_not() -> None:
    assert parse("x IN (1, 2)").predicate == In(("x",), (1, 2), False)
    assert parse("x NOT IN (1, 2)").predicate == In(("x",), (1, 2), True)
    assert parse("x not in ()").predicate == In(("x",), (), True)
    assert parse("x IN (null, ?, 'a', -1.5)").predicate == In(
        ("x",), (None, Placeholder(0), "a", -1.5), False
    )


@pytest.mark.parametrize(
    ("text", "normalised"),
    [
        ("5 < year", "year > 5"),
        ("5 <= year", "year >= 5"),
        ("5 > year", "year < 5"),
        ("5 >= year", "year <= 5"),
        ("5 = year", "year = 5"),
        ("5 != year", "year != 5"),
        ("? < year", "year > ?"),
        ("-2.5 <> meta.size", "meta.size != -2.5"),
    ],
)
def test_a_literal_on_the_left_is_moved_right_with_the_operator_flipped(
    text: str, normalised: str
) -> None:
    assert parse(text) == parse(normalised)
    assert parse(text).to_text() == normalised


def test_is_null_and_is_not_null_parse() -> None:
    assert parse("x IS NULL").predicate == IsNull(("x",), False)
    assert parse("a.b is not null").predicate == IsNull(("a", "b"), True)


def test_fields_may_be_compared_with_fields() -> None:
    assert parse("a < b.c").predicate == FieldComparison(("a",), Op.LT, ("b", "c"))


def test_paths_and_quoted_segments() -> None:
    query = parse('meta.author."full name" = 1 AND "order".x = 2 AND notes = 3 AND order_id = 4')
    assert isinstance(query.predicate, And)
    assert [item.path for item in query.predicate.items] == [  # type: ignore[union-attr]
        ("meta", "author", "full name"),
        ("order", "x"),
        ("notes",),
        ("order_id",),
    ]
    assert parse(r'"a""b\"c" = 1').predicate == eq('a"b"c', 1)


def test_the_predicate_may_be_omitted() -> None:
    assert parse("") == Query()
    assert parse("   ") == Query()
    assert parse("ORDER BY year LIMIT 20") == Query(Const(True), (OrderKey(("year",)),), 20)
    assert parse("limit 0").limit == 0
    assert parse("TRUE").predicate == Const(True)
    assert parse("FALSE").predicate == Const(False)


def test_order_by_takes_several_paths_with_directions() -> None:
    query = parse("x > 1 ORDER BY a ASC, b.c DESC, d LIMIT ?")
    assert query.order_by == (
        OrderKey(("a",)),
        OrderKey(("b", "c"), descending=True),
        OrderKey(("d",)),
    )
    assert query.limit == Placeholder(0)
    assert query.placeholders == 1


def test_placeholders_are_numbered_in_text_order() -> None:
    query = parse("? < a AND b IN (?, 1, ?) ORDER BY a LIMIT ?")
    assert query.placeholders == 4
    assert query.predicate == And(
        (
            Comparison(("a",), Op.GT, Placeholder(0)),
            In(("b",), (Placeholder(1), 1, Placeholder(2))),
        )
    )
    assert query.limit == Placeholder(3)


@pytest.mark.parametrize("args", [(), (1, 2, 3, 4, 5)])
def test_binding_the_wrong_number_of_arguments_says_how_many_are_needed(
    args: tuple[int, ...],
) -> None:
    query = parse("? < a AND b IN (?, 1, ?) ORDER BY a LIMIT ?")
    with pytest.raises(InvalidArgument, match=rf"has 4 \? placeholder.*given {len(args)} arg"):
        query.bind(*args)


@pytest.mark.parametrize(
    ("text", "column"),
    [
        ("year >", 7),
        ("year > 1985 AND", 16),
        ("x = 'abc", 5),
        ('"abc = 1', 1),
        ("x ! 1", 3),
        ("x = 99999999999999999999", 5),
        ("x = 9223372036854775808", 5),
        ("x = 1e999", 5),
        ("x = 1.", 5),
        ("x = .5", 5),
        ("x = 5abc", 5),
        ("x = - 5", 5),
        ("x = 1 LIMIT -1", 13),
        ("x = 1 LIMIT 1.5", 13),
        ("x = 1 LIMIT", 12),
        ("x = 1 ORDER year", 13),
        ("x = 1 ORDER BY", 15),
        ("x = 1 ORDER BY 3", 16),
        ("x = 1 x = 2", 7),
        ("(x = 1", 7),
        ("x = 1)", 6),
        ("x", 2),
        ("5", 2),
        ("1 = 2", 1),
        ("? = ?", 1),
        ("x IN 1", 6),
        ("x IN (1, y)", 10),
        ("x IN (1 2)", 9),
        ("1 IN (1)", 1),
        ("x IS 5", 6),
        ("x NOT = 5", 3),
        ("x = 'a\\qb'", 7),
        ("x = '\\u12'", 6),
        ("x = 'abc\\", 9),
        ("x = '\\U00110000'", 6),
        ("x = X'0g'", 8),
        ("x = X'0'", 5),
        ("x = X'00", 5),
        ("a. = 1", 4),
        ("a.5 = 1", 3),
        ("x = 1 @", 7),
        ("x = 'ok' AND y = é", 18),
        ("ORDER BY", 9),
        ("NOT", 4),
        ("AND x = 1", 1),
    ],
)
def test_syntax_errors_point_at_the_offending_column(text: str, column: int) -> None:
    with pytest.raises(QueryError) as caught:
        parse(text)
    assert caught.value.column == column, str(caught.value)


def test_input_longer_than_the_limit_is_refused() -> None:
    text = "x = '" + "a" * MAX_QUERY_LENGTH + "'"
    with pytest.raises(QueryError, match="longer than") as caught:
        parse(text)
    assert caught.value.column == MAX_QUERY_LENGTH + 1


def test_nesting_deeper_than_the_limit_is_refused() -> None:
    assert parse("(" * MAX_DEPTH + "x = 1" + ")" * MAX_DEPTH).predicate == eq("x", 1)
    with pytest.raises(QueryError, match="nests deeper") as caught:
        parse("(" * (MAX_DEPTH + 1) + "x = 1" + ")" * (MAX_DEPTH + 1))
    assert caught.value.column == MAX_DEPTH + 1
    with pytest.raises(QueryError, match="nests deeper"):
        parse("NOT " * 10_000 + "x = 1")


def test_a_non_string_query_is_an_invalid_argument() -> None:
    with pytest.raises(InvalidArgument):
        parse(b"x = 1")  # type: ignore[arg-type]


_FRAGMENTS = [
    "x", "a.b", '"q"', "(", ")", " AND ", " OR ", "NOT ", " IN ", " IS ", "NULL", ",", "'",
    "'s'", '"', "?", "1", "-", "-2.5", "1e5", ".", "=", "!=", "<>", "<", ">=", " ", "\\",
    "X'", "X'0f'", " ORDER BY ", " LIMIT ", " DESC", "TRUE", "\x00", "é", "\n",
]  # fmt: skip


@given(st.lists(st.sampled_from(_FRAGMENTS), max_size=14).map("".join) | st.text(max_size=30))
def test_any_text_parses_or_raises_a_query_error_with_a_column(text: str) -> None:
    failure: QueryError | None = None
    try:
        query = parse(text)
    except QueryError as error:
        failure = error
    if failure is None:
        assert parse(query.to_text()) == query
    else:
        assert failure.column is not None
        assert 1 <= failure.column <= len(text) + 1
