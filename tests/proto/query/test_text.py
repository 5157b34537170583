"""Canonical text round trips, binding arguments, and the fields a query reads."""

from __future__ import annotations

import pytest
from hypothesis import given

from mycelia.errors import InvalidArgument
from mycelia.proto.ids import EntityId
from mycelia.proto.query import (
    And,
    Comparison,
    Const,
    In,
    Op,
    Or,
    OrderKey,
    Placeholder,
    Query,
    parse,
)
from tests.proto.query.strategies import queries


@given(queries())
def test_the_canonical_text_parses_back_to_an_equal_query(query: Query) -> None:
    text = query.to_text()
    again = parse(text)
    assert again == query
    assert again.to_text() == text
    assert hash(again) == hash(query)


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("", ""),
        ("true", ""),
        ("x<>1", "x != 1"),
        (
            "  x   =   'a'  order   by  y  asc , z desc  limit   5 ",
            "x = 'a' ORDER BY y, z DESC LIMIT 5",
        ),
        ("a=1 or (b=2 or c=3)", "a = 1 OR (b = 2 OR c = 3)"),
        ("a=1 and (b=2 or c=3)", "a = 1 AND (b = 2 OR c = 3)"),
        ("not (a=1 and b=2)", "NOT (a = 1 AND b = 2)"),
        ("(((a = 1)))", "a = 1"),
        ("x = 1e3 AND y = -0.0 AND z = 1E-7", "x = 1000.0 AND y = -0.0 AND z = 1e-07"),
        ("x = 'it''s\\n' AND y = '\\u0000\\u00e9'", "x = 'it\\'s\\n' AND y = '\\u0000é'"),
        ('"order" = 1 AND "a b".c = 2 AND "x" = 3', '"order" = 1 AND "a b".c = 2 AND x = 3'),
        ("x = X'ABCD'", "x = X'abcd'"),
        ("x not in (?, null) and y is not null", "x NOT IN (?, NULL) AND y IS NOT NULL"),
    ],
)
def test_the_canonical_text_is_normalised(text: str, canonical: str) -> None:
    assert parse(text).to_text() == canonical
    assert str(parse(text)) == canonical


def test_typed_literals_keep_queries_apart() -> None:
    assert parse("x = 1") != parse("x = TRUE")
    assert parse("x = 1") != parse("x = 1.0")
    assert parse("x IN (0)") != parse("x IN (FALSE)")
    assert len({parse("x = 1"), parse("x = TRUE"), parse("x = 1.0"), parse("x = 1")}) == 3


def test_bind_substitutes_values_never_text() -> None:
    query = parse("name = ? AND year IN (?, ?) ORDER BY year LIMIT ?")
    assert query.placeholders == 4
    bound = query.bind("x' OR TRUE OR name = 'y", -2.5, None, 10)
    assert bound.placeholders == 0
    assert bound.predicate == And(
        (
            Comparison(("name",), Op.EQ, "x' OR TRUE OR name = 'y"),
            In(("year",), (-2.5, None)),
        )
    )
    assert bound.limit == 10
    assert parse(bound.to_text()) == bound


def test_bind_stores_ids_as_plain_bytes() -> None:
    entity_id = EntityId(bytes(range(32)))
    bound = parse("ref = ?").bind(entity_id)
    assert isinstance(bound.predicate, Comparison)
    assert type(bound.predicate.value) is bytes
    assert bound.predicate.value == bytes(range(32))
    assert parse(bound.to_text()) == bound


@pytest.mark.parametrize(
    ("text", "args"),
    [
        ("x = ?", ()),
        ("x = ?", (1, 2)),
        ("x = 1", (1,)),
        ("x = ?", (float("nan"),)),
        ("x = ?", (float("inf"),)),
        ("x = ?", (2**63,)),
        ("x = ?", (-(2**63) - 1,)),
        ("x = ?", ([1, 2],)),
        ("x = ?", ({"a": 1},)),
        ("x = ?", (object(),)),
        ("LIMIT ?", (-1,)),
        ("LIMIT ?", (True,)),
        ("LIMIT ?", (1.0,)),
        ("LIMIT ?", ("5",)),
    ],
)
def test_bind_refuses_a_wrong_count_or_an_unsupported_argument(
    text: str, args: tuple[object, ...]
) -> None:
    with pytest.raises(InvalidArgument):
        parse(text).bind(*args)


def test_fields_are_the_top_level_names_read() -> None:
    query = parse("a.b = 1 OR NOT c IN (1) AND 5 < d OR e < f.g ORDER BY h.i DESC, a")
    assert query.fields() == {"a", "c", "d", "e", "f", "h"}
    assert parse("").fields() == frozenset()


def test_hand_built_queries_are_checked() -> None:
    with pytest.raises(InvalidArgument):
        Query(Comparison(("x",), Op.EQ, Placeholder(1)))
    with pytest.raises(InvalidArgument):
        Query(limit=-1)
    with pytest.raises(InvalidArgument):
        And((Const(True),))
    with pytest.raises(InvalidArgument):
        Or(())
    with pytest.raises(InvalidArgument):
        Comparison((), Op.EQ, 1)
    with pytest.raises(InvalidArgument):
        Comparison(("x",), "~", 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        Comparison(("x",), Op.EQ, float("nan"))
    with pytest.raises(InvalidArgument):
        OrderKey(("x", 1))  # type: ignore[arg-type]
    assert Comparison(["x"], "<=", 1) == Comparison(("x",), Op.LE, 1)  # type: ignore[arg-type]
