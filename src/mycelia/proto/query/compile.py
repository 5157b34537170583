"""Predicates compiled to closures: :func:`evaluate`'s semantics, without re-walking the AST.

A live query evaluates its predicate on every change it is a candidate for, so the tree
walk and the per-value class dispatch of :func:`~mycelia.proto.query.evaluate` are paid
over and over. :func:`compile_predicate` does the dispatch once: a comparison with a
scalar literal becomes a closure that knows the literal's collation class and checks
only whether the row's value is in the same class before comparing with Python's own
operators (which are the collation within a class). Anything unusual — a field compared
with a field, a list or object value, a value outside the fast classes — goes through
:func:`~mycelia.proto.query.evaluate.holds`, the one semantics.

Invariant (a property test holds it to it): for every bound predicate and every row,
``compile_predicate(p)(row) == evaluate(p, row)``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from typing import Any, Final

from mycelia.errors import InvalidArgument
from mycelia.proto.query.evaluate import evaluate, holds
from mycelia.proto.query.syntax import (
    And,
    Comparison,
    Const,
    In,
    IsNull,
    Not,
    Op,
    Or,
    Placeholder,
    Predicate,
)
from mycelia.proto.query.values import Collation, class_of, resolve_path

__all__ = ["Compiled", "compile_predicate"]

Compiled = Callable[[Mapping[str, object]], bool]
"""A compiled predicate: a row (field name to value) in, True or False out."""

_ORDERING: Final[dict[Op, Callable[[Any, Any], object]]] = {
    Op.LT: operator.lt,
    Op.LE: operator.le,
    Op.GT: operator.gt,
    Op.GE: operator.ge,
}


def compile_predicate(predicate: Predicate) -> Compiled:
    """A closure equivalent to ``evaluate(predicate, row)`` (bind the query first).

    Raises InvalidArgument if the predicate still holds a placeholder.
    """
    if isinstance(predicate, Comparison):
        return _comparison(predicate)
    if isinstance(predicate, IsNull):
        return _is_null(_getter(predicate.path), negated=predicate.negated)
    if isinstance(predicate, And):
        parts = tuple(compile_predicate(item) for item in predicate.items)
        if len(parts) == 2:  # (every read path ANDs "not deleted" to the query's own)
            first, second = parts
            return lambda row: first(row) and second(row)
        return lambda row: all(part(row) for part in parts)
    if isinstance(predicate, Or):
        parts = tuple(compile_predicate(item) for item in predicate.items)
        return lambda row: any(part(row) for part in parts)
    if isinstance(predicate, Not):
        inner = compile_predicate(predicate.item)
        return lambda row: not inner(row)
    if isinstance(predicate, Const):
        constant = predicate.value
        return lambda row: constant
    if isinstance(predicate, In) and any(isinstance(v, Placeholder) for v in predicate.values):
        raise InvalidArgument("the query has an unbound '?': call Query.bind first")
    return lambda row: evaluate(predicate, row)  # field vs field, IN: the reference


def _getter(path: tuple[str, ...]) -> Callable[[Mapping[str, object]], object]:
    if len(path) == 1:
        (name,) = path
        return lambda row: row.get(name)
    return lambda row: resolve_path(row, path)


def _is_null(get: Callable[[Mapping[str, object]], object], *, negated: bool) -> Compiled:
    """``IS [NOT] NULL``: a plain string, number, bool or bytes is not null, with no class
    dispatch (every read path tests "not deleted" on every row it reads)."""

    def is_null(row: Mapping[str, object]) -> bool:
        value = get(row)
        if value is None:
            return not negated
        kind = type(value)
        if kind is str or kind is int or kind is bool or kind is bytes:
            return negated
        return (class_of(value) is Collation.NULL) != negated  # NaN; or refused, as evaluate

    return is_null


def _comparison(predicate: Comparison) -> Compiled:
    literal, op, get = predicate.value, predicate.op, _getter(predicate.path)
    if isinstance(literal, Placeholder):
        raise InvalidArgument("the query has an unbound '?': call Query.bind first")
    literal_class = class_of(literal)
    if literal_class is Collation.NULL:
        return lambda row: False  # a comparison with null is false
    same = _SAME_CLASS.get(literal_class)
    if same is None:
        return lambda row: holds(op, get(row), literal)
    if op is Op.EQ:
        return lambda row: same(value := get(row)) and bool(value == literal)
    if op is Op.NE:

        def not_equal(row: Mapping[str, object]) -> bool:
            value = get(row)
            if same(value):
                return bool(value != literal)
            return holds(op, value, literal)  # across classes: true unless null

        return not_equal
    compare = _ORDERING[op]
    return lambda row: same(value := get(row)) and bool(compare(value, literal))


def _is_number(value: object) -> bool:
    kind = type(value)
    if kind is int:
        return True
    if kind is float:
        return not math.isnan(value)  # type: ignore[arg-type]  # a float, checked above
    if kind is bool:
        return False
    return isinstance(value, int | float) and class_of(value) is Collation.NUMBER


def _is_string(value: object) -> bool:
    return isinstance(value, str)


def _is_bytes(value: object) -> bool:
    return isinstance(value, bytes | bytearray)


def _is_bool(value: object) -> bool:
    return value is True or value is False


_SAME_CLASS: Final[dict[Collation, Callable[[object], bool]]] = {
    Collation.NUMBER: _is_number,
    Collation.STRING: _is_string,
    Collation.BYTES: _is_bytes,
    Collation.BOOL: _is_bool,
}
"""Per scalar class, whether a value is in it (so Python's operators are the collation)."""
