"""The one evaluation semantics of predicates (the package docstring states it in full).

Invariants:

- Two-valued logic: every predicate is true or false, never unknown. A comparison with a
  null (or missing, or NaN) side is false, so ``NOT`` of it is true.
- ``=`` holds when both sides are in the same collation class and collate equal; ``!=`` is
  its negation among non-null values; ``< <= > >=`` hold only within an ordered class
  (bool, number, string, bytes) and follow :func:`compare_values` there.
- Reaching an unbound ``?`` raises InvalidArgument (bind the query first).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from mycelia.errors import InvalidArgument
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
    Placeholder,
    Predicate,
)
from mycelia.proto.query.values import (
    ORDERED_CLASSES,
    Collation,
    class_of,
    compare_values,
    resolve_path,
)

__all__ = ["evaluate", "holds"]

_ORDER_OPS: Final = {
    Op.LT: (-1,),
    Op.LE: (-1, 0),
    Op.GT: (1,),
    Op.GE: (0, 1),
}


def holds(op: Op, left: object, right: object) -> bool:
    """Whether ``left op right`` is true under the query semantics (see the module docstring).

    Raises InvalidArgument for a value outside the value model or a placeholder.
    """
    if isinstance(left, Placeholder) or isinstance(right, Placeholder):
        raise InvalidArgument("the query has an unbound '?': call Query.bind first")
    left_class, right_class = class_of(left), class_of(right)
    if left_class is Collation.NULL or right_class is Collation.NULL:
        return False
    if op is Op.EQ or op is Op.NE:
        equal = left_class is right_class and compare_values(left, right) == 0
        return equal == (op is Op.EQ)
    if left_class is not right_class or left_class not in ORDERED_CLASSES:
        return False
    return compare_values(left, right) in _ORDER_OPS[op]


def evaluate(predicate: Predicate, values: Mapping[str, object]) -> bool:
    """Whether the row ``values`` (field name to value) satisfies ``predicate``.

    Missing fields are null. Raises InvalidArgument if evaluation reaches an unbound
    placeholder (bind first: :func:`sort_rows` checks up front) or a value outside the value
    model.
    """
    if isinstance(predicate, Comparison):
        return holds(predicate.op, resolve_path(values, predicate.path), predicate.value)
    if isinstance(predicate, FieldComparison):
        left = resolve_path(values, predicate.left_path)
        return holds(predicate.op, left, resolve_path(values, predicate.right_path))
    if isinstance(predicate, In):
        value = resolve_path(values, predicate.path)
        found = any(holds(Op.EQ, value, item) for item in predicate.values)
        return found != predicate.negated
    if isinstance(predicate, IsNull):
        is_null = class_of(resolve_path(values, predicate.path)) is Collation.NULL
        return is_null != predicate.negated
    if isinstance(predicate, And):
        return all(evaluate(item, values) for item in predicate.items)
    if isinstance(predicate, Or):
        return any(evaluate(item, values) for item in predicate.items)
    if isinstance(predicate, Not):
        return not evaluate(predicate.item, values)
    assert isinstance(predicate, Const)
    return predicate.value
