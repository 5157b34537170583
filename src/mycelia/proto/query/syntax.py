"""The query AST: immutable predicate nodes, operators, placeholders and ORDER BY keys.

Invariants:

- Every node is a frozen, slotted dataclass; a node that exists is expressible in the query
  text (``Query.to_text`` can print it and ``parse`` reads it back equal): paths are
  non-empty tuples of strings, literals are within :func:`check_literal`'s domain (finite
  floats, 64-bit integers, ``bytes`` subclasses stored as plain ``bytes``), ``And``/``Or``
  hold at least two items.
- A comparison with a literal always has the field on the left: the parser turns
  ``5 < year`` into ``year > 5``.
- Literal equality is *typed*: ``x = 1``, ``x = 1.0`` and ``x = TRUE`` are three different
  nodes (Python's ``True == 1 == 1.0`` must not merge, e.g., two live queries).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, TypeAlias

from mycelia.errors import InvalidArgument
from mycelia.proto.query.values import INT_MAX, INT_MIN, Scalar

__all__ = [
    "And",
    "Comparison",
    "Const",
    "FieldComparison",
    "In",
    "IsNull",
    "Not",
    "Op",
    "Or",
    "OrderKey",
    "Placeholder",
    "Predicate",
    "check_literal",
    "check_op",
    "check_path",
    "cost",
    "iter_placeholders",
    "paths",
]


class Op(enum.Enum):
    """A comparison operator; its value is its canonical symbol."""

    EQ = "="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="

    @property
    def flipped(self) -> Op:
        """The operator that holds with the operands swapped (``a < b`` iff ``b > a``)."""
        return _FLIPPED[self]


_FLIPPED: Final = {
    Op.EQ: Op.EQ,
    Op.NE: Op.NE,
    Op.LT: Op.GT,
    Op.LE: Op.GE,
    Op.GT: Op.LT,
    Op.GE: Op.LE,
}


@dataclass(frozen=True, slots=True)
class Placeholder:
    """A ``?`` awaiting an argument; ``index`` is its 0-based position in the query text."""

    index: int


@dataclass(frozen=True, slots=True)
class OrderKey:
    """One ORDER BY column: a path and its direction (ascending unless ``descending``)."""

    path: tuple[str, ...]
    descending: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", check_path(self.path))


def check_path(path: object) -> tuple[str, ...]:
    """``path`` as a tuple of strings; raises InvalidArgument if it is empty or not strings."""
    if not isinstance(path, tuple | list) or not path:
        raise InvalidArgument(f"a path is a non-empty tuple of strings, got {path!r}")
    if not all(isinstance(segment, str) for segment in path):
        raise InvalidArgument(f"path segments must be strings, got {path!r}")
    return tuple(path)


def check_literal(value: object, *, what: str = "literal") -> Scalar:
    """``value`` as a query literal, or InvalidArgument naming ``what``.

    Accepted: None, bool, int in the 64-bit signed range, finite float, str, bytes (any
    subclass or bytearray, returned as plain ``bytes``).
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)  # a plain str: subclasses must not change equality
    if isinstance(value, int):
        if not INT_MIN <= value <= INT_MAX:
            raise InvalidArgument(f"{what} {value} is outside the 64-bit integer range")
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidArgument(f"{what} must be a finite number, got {value!r}")
        return float(value)
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    raise InvalidArgument(f"{what} of type {type(value).__name__} is not a query value")


def check_op(op: object) -> Op:
    """``op`` as an :class:`Op` (a member or its symbol); raises InvalidArgument otherwise."""
    try:
        return Op(op)
    except ValueError:
        raise InvalidArgument(f"{op!r} is not a comparison operator") from None


def _typed(value: Scalar | Placeholder) -> tuple[type, object]:
    return (type(value), value)


def _literal(value: object) -> Scalar | Placeholder:
    return value if isinstance(value, Placeholder) else check_literal(value)


@dataclass(frozen=True, slots=True, eq=False)
class Comparison:
    """``path op value``: a field compared with a literal (or a ``?``)."""

    path: tuple[str, ...]
    op: Op
    value: Scalar | Placeholder

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", check_path(self.path))
        object.__setattr__(self, "op", check_op(self.op))
        object.__setattr__(self, "value", _literal(self.value))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Comparison):
            return NotImplemented
        return (self.path, self.op, _typed(self.value)) == (
            other.path,
            other.op,
            _typed(other.value),
        )

    def __hash__(self) -> int:
        return hash((self.path, self.op, _typed(self.value)))


@dataclass(frozen=True, slots=True)
class FieldComparison:
    """``left_path op right_path``: two fields of the same row compared."""

    left_path: tuple[str, ...]
    op: Op
    right_path: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "left_path", check_path(self.left_path))
        object.__setattr__(self, "op", check_op(self.op))
        object.__setattr__(self, "right_path", check_path(self.right_path))


@dataclass(frozen=True, slots=True, eq=False)
class In:
    """``path IN (values)``, or ``path NOT IN (values)`` when ``negated``."""

    path: tuple[str, ...]
    values: tuple[Scalar | Placeholder, ...]
    negated: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", check_path(self.path))
        object.__setattr__(self, "values", tuple(_literal(value) for value in self.values))

    def _key(self) -> tuple[object, ...]:
        return (self.path, tuple(_typed(value) for value in self.values), self.negated)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, In):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


@dataclass(frozen=True, slots=True)
class IsNull:
    """``path IS NULL``, or ``path IS NOT NULL`` when ``negated``."""

    path: tuple[str, ...]
    negated: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", check_path(self.path))


@dataclass(frozen=True, slots=True)
class And:
    """True when every item is (at least two items; use ``Const`` for fewer)."""

    items: tuple[Predicate, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "items", _check_items(self.items, "And"))


@dataclass(frozen=True, slots=True)
class Or:
    """True when any item is (at least two items; use ``Const`` for fewer)."""

    items: tuple[Predicate, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "items", _check_items(self.items, "Or"))


@dataclass(frozen=True, slots=True)
class Not:
    """True when ``item`` is false (two-valued: ``NOT (x = 5)`` is true for a null ``x``)."""

    item: Predicate


@dataclass(frozen=True, slots=True)
class Const:
    """A constant predicate: ``TRUE`` (also the omitted predicate) or ``FALSE``."""

    value: bool


Predicate: TypeAlias = Comparison | FieldComparison | In | IsNull | And | Or | Not | Const
"""Any predicate node."""


def _check_items(items: tuple[Predicate, ...], name: str) -> tuple[Predicate, ...]:
    items = tuple(items)
    if len(items) < 2:
        raise InvalidArgument(f"{name} needs at least two items, got {len(items)}")
    return items


def iter_placeholders(predicate: Predicate) -> Iterator[Placeholder]:
    """The predicate's placeholders in text order (the order ``Query.to_text`` prints)."""
    if isinstance(predicate, Comparison):
        if isinstance(predicate.value, Placeholder):
            yield predicate.value
    elif isinstance(predicate, In):
        yield from (value for value in predicate.values if isinstance(value, Placeholder))
    elif isinstance(predicate, And | Or):
        for item in predicate.items:
            yield from iter_placeholders(item)
    elif isinstance(predicate, Not):
        yield from iter_placeholders(predicate.item)


def paths(predicate: Predicate) -> Iterator[tuple[str, ...]]:
    """Every path the predicate reads, in text order (with repetitions)."""
    if isinstance(predicate, Comparison | In | IsNull):
        yield predicate.path
    elif isinstance(predicate, FieldComparison):
        yield predicate.left_path
        yield predicate.right_path
    elif isinstance(predicate, And | Or):
        for item in predicate.items:
            yield from paths(item)
    elif isinstance(predicate, Not):
        yield from paths(predicate.item)


def cost(predicate: Predicate) -> int:
    """What evaluating the predicate on one row costs, in tests: one per comparison or
    null test, one per value of an IN list, nothing for a constant (the unit of the query
    cost budget, ARCHITECTURE.md §8)."""
    if isinstance(predicate, Comparison | FieldComparison | IsNull):
        return 1
    if isinstance(predicate, In):
        return max(1, len(predicate.values))
    if isinstance(predicate, And | Or):
        return sum(cost(item) for item in predicate.items)
    if isinstance(predicate, Not):
        return cost(predicate.item)
    return 0
