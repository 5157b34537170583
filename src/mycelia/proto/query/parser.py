"""The recursive-descent parser: query text to :class:`~mycelia.proto.query.query.Query`.

Grammar (keywords case-insensitive; precedence NOT > AND > OR)::

    query      := [or_expr] [ORDER BY order_key {"," order_key}] [LIMIT (integer | "?")]
    or_expr    := and_expr {OR and_expr}
    and_expr   := not_expr {AND not_expr}
    not_expr   := NOT not_expr | "(" or_expr ")" | TRUE | FALSE | test
    test       := operand op operand                 -- at least one side a path
                | path [NOT] IN "(" [literal {"," literal}] ")"
                | path IS [NOT] NULL
    operand    := path | literal
    literal    := number | string | bytes | TRUE | FALSE | NULL | "?"
    path       := segment {"." segment}              -- segment: identifier or "quoted"
    order_key  := path [ASC | DESC]
    op         := "=" | "!=" | "<>" | "<" | "<=" | ">" | ">="

Invariants:

- It raises nothing but :class:`~mycelia.errors.QueryError` with a 1-based column, for any
  input string; nesting (parentheses and NOT) deeper than :data:`MAX_DEPTH` is refused, so
  recursion stays bounded.
- ``literal op path`` becomes ``path flipped(op) literal``; ``?`` are numbered in text order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from mycelia.errors import InvalidArgument, QueryError
from mycelia.proto.query.lexer import Kind, Token, tokenize
from mycelia.proto.query.query import Query
from mycelia.proto.query.syntax import (
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
)
from mycelia.proto.query.values import Scalar

__all__ = ["MAX_DEPTH", "parse"]

MAX_DEPTH: Final = 64
"""Deepest nesting of parentheses and NOT a query may have."""

_LITERAL_KEYWORDS: Final[dict[str, Scalar]] = {"NULL": None, "TRUE": True, "FALSE": False}


def parse(text: str) -> Query:
    """Parse ``text`` into a :class:`Query`; raises QueryError (with ``column``) if malformed.

    The predicate may be omitted (``""`` and ``"ORDER BY year LIMIT 20"`` match every row).
    """
    if not isinstance(text, str):
        raise InvalidArgument(f"a query is a str, got {type(text).__name__}")
    return _Parser(tokenize(text)).query()


@dataclass(frozen=True, slots=True)
class _Literal:
    value: Scalar | Placeholder
    token: Token


_Operand = tuple[tuple[str, ...], Token] | _Literal


class _Parser:
    """One parse: a cursor over the tokens, the nesting depth, the placeholders seen."""

    def __init__(self, tokens: list[Token]) -> None:
        self._tokens = tokens
        self._pos = 0
        self._depth = 0
        self._placeholders = 0

    # -- cursor ---------------------------------------------------------------------------

    def _peek(self, ahead: int = 0) -> Token:
        return self._tokens[min(self._pos + ahead, len(self._tokens) - 1)]

    def _advance(self) -> Token:
        token = self._peek()
        self._pos = min(self._pos + 1, len(self._tokens) - 1)
        return token

    def _at_keyword(self, *names: str, ahead: int = 0) -> bool:
        token = self._peek(ahead)
        return token.kind is Kind.KEYWORD and token.name in names

    def _accept_keyword(self, name: str) -> Token | None:
        return self._advance() if self._at_keyword(name) else None

    def _expect(self, kind: Kind, expected: str) -> Token:
        if self._peek().kind is not kind:
            raise _unexpected(self._peek(), expected)
        return self._advance()

    def _expect_keyword(self, name: str) -> Token:
        if not self._at_keyword(name):
            raise _unexpected(self._peek(), name)
        return self._advance()

    def _enter(self, token: Token) -> None:
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise QueryError(f"query nests deeper than {MAX_DEPTH} levels", column=token.column)

    # -- query ----------------------------------------------------------------------------

    def query(self) -> Query:
        predicate: Predicate = Const(True)
        if not (self._peek().kind is Kind.END or self._at_keyword("ORDER", "LIMIT")):
            predicate = self._or()
        order_by: tuple[OrderKey, ...] = ()
        if self._accept_keyword("ORDER"):
            self._expect_keyword("BY")
            order_by = self._order_by()
        limit: int | Placeholder | None = None
        if self._accept_keyword("LIMIT"):
            limit = self._limit()
        if self._peek().kind is not Kind.END:
            raise _unexpected(self._peek(), "AND, OR, ORDER BY, LIMIT or the end of the query")
        return Query(predicate, order_by, limit)

    def _order_by(self) -> tuple[OrderKey, ...]:
        keys = []
        while True:
            path, _ = self._path("a field to order by")
            descending = self._at_keyword("DESC")
            if self._at_keyword("ASC", "DESC"):
                self._advance()
            keys.append(OrderKey(path, descending))
            if self._peek().kind is not Kind.COMMA:
                return tuple(keys)
            self._advance()

    def _limit(self) -> int | Placeholder:
        token = self._advance()
        if token.kind is Kind.PLACEHOLDER:
            return self._placeholder()
        value = token.value
        if token.kind is Kind.LITERAL and type(value) is int and value >= 0:
            return value
        raise QueryError("LIMIT needs a non-negative integer or '?'", column=token.column)

    def _placeholder(self) -> Placeholder:
        self._placeholders += 1
        return Placeholder(self._placeholders - 1)

    # -- predicates -----------------------------------------------------------------------

    def _or(self) -> Predicate:
        items = [self._and()]
        while self._accept_keyword("OR"):
            items.append(self._and())
        return items[0] if len(items) == 1 else Or(tuple(items))

    def _and(self) -> Predicate:
        items = [self._not()]
        while self._accept_keyword("AND"):
            items.append(self._not())
        return items[0] if len(items) == 1 else And(tuple(items))

    def _not(self) -> Predicate:
        token = self._accept_keyword("NOT")
        if token is None:
            return self._primary()
        self._enter(token)
        item = self._not()
        self._depth -= 1
        return Not(item)

    def _primary(self) -> Predicate:
        if self._peek().kind is not Kind.LPAREN:
            return self._test()
        self._enter(self._advance())
        inner = self._or()
        self._expect(Kind.RPAREN, "')'")
        self._depth -= 1
        return inner

    def _test(self) -> Predicate:
        left = self._operand()
        following = self._peek()
        if following.kind is Kind.OP:
            self._advance()
            return _comparison(left, Op(following.name), self._operand())
        if self._at_keyword("IN") or (self._at_keyword("NOT") and self._at_keyword("IN", ahead=1)):
            return self._in(_require_path(left, "IN"))
        if self._at_keyword("IS"):
            return self._is_null(_require_path(left, "IS"))
        if isinstance(left, _Literal) and isinstance(left.value, bool):
            return Const(left.value)
        raise _unexpected(following, "a comparison operator, IN or IS")

    def _in(self, path: tuple[str, ...]) -> Predicate:
        negated = self._accept_keyword("NOT") is not None
        self._expect_keyword("IN")
        self._expect(Kind.LPAREN, "'(' to open the IN list")
        values: list[Scalar | Placeholder] = []
        if self._peek().kind is not Kind.RPAREN:
            values.append(self._literal())
            while self._peek().kind is Kind.COMMA:
                self._advance()
                values.append(self._literal())
        self._expect(Kind.RPAREN, "',' or ')'")
        return In(path, tuple(values), negated)

    def _is_null(self, path: tuple[str, ...]) -> Predicate:
        self._expect_keyword("IS")
        negated = self._accept_keyword("NOT") is not None
        self._expect_keyword("NULL")
        return IsNull(path, negated)

    # -- operands -------------------------------------------------------------------------

    def _operand(self) -> _Operand:
        if self._peek().kind in (Kind.WORD, Kind.QUOTED):
            return self._path("a field")
        token = self._peek()
        if token.kind is Kind.PLACEHOLDER:
            self._advance()
            return _Literal(self._placeholder(), token)
        if token.kind is Kind.LITERAL:
            self._advance()
            return _Literal(token.value, token)
        if token.kind is Kind.KEYWORD and token.name in _LITERAL_KEYWORDS:
            self._advance()
            return _Literal(_LITERAL_KEYWORDS[token.name], token)
        raise _unexpected(token, "a field or a value")

    def _literal(self) -> Scalar | Placeholder:
        token = self._peek()
        operand = self._operand()
        if not isinstance(operand, _Literal):
            raise QueryError("IN lists hold values, not fields", column=token.column)
        return operand.value

    def _path(self, expected: str) -> tuple[tuple[str, ...], Token]:
        first = self._expect_segment(expected)
        segments = [first.name]
        while self._peek().kind is Kind.DOT:
            self._advance()
            segments.append(self._expect_segment("a field name after '.'").name)
        return tuple(segments), first

    def _expect_segment(self, expected: str) -> Token:
        if self._peek().kind not in (Kind.WORD, Kind.QUOTED):
            raise _unexpected(self._peek(), expected)
        return self._advance()


def _comparison(left: _Operand, op: Op, right: _Operand) -> Predicate:
    if isinstance(left, tuple) and isinstance(right, tuple):
        return FieldComparison(left[0], op, right[0])
    if isinstance(left, tuple):
        assert isinstance(right, _Literal)
        return Comparison(left[0], op, right.value)
    if isinstance(right, tuple):
        return Comparison(right[0], op.flipped, left.value)
    raise QueryError("a comparison needs a field on at least one side", column=left.token.column)


def _require_path(operand: _Operand, keyword: str) -> tuple[str, ...]:
    if isinstance(operand, _Literal):
        raise QueryError(f"{keyword} needs a field on its left", column=operand.token.column)
    return operand[0]


def _unexpected(token: Token, expected: str) -> QueryError:
    return QueryError(f"expected {expected}, found {token.describe()}", column=token.column)
