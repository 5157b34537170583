"""Values, their collation classes and the collation: the one total order on values.

Invariants:

- The value model is ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes`` (any subclass,
  so ids compare as their bytes; ``bytearray`` too), lists (``list`` or ``tuple``) and objects
  (any ``Mapping`` with ``str`` keys). Anything else raises
  :class:`~mycelia.errors.InvalidArgument`; so does nesting deeper than
  :data:`MAX_VALUE_DEPTH`.
- A float NaN *is* null, wherever it appears (top level or inside a container).
- :func:`class_of` ranks the classes in collation order: null < bool < number < string <
  bytes < list < object; :func:`compare_values` is a total order refining that ranking and
  is exactly the order of :func:`mycelia.proto.query.keys.encode_key`'s bytes.
- Numbers compare by exact mathematical value across ``int`` and ``float`` (CPython's own
  int/float comparison is exact), so ``1 == 1.0`` and ``-0.0 == 0.0``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any, Final, TypeAlias

from mycelia.errors import InvalidArgument

__all__ = [
    "INT_MAX",
    "INT_MIN",
    "MAX_VALUE_DEPTH",
    "ORDERED_CLASSES",
    "Collation",
    "Scalar",
    "class_of",
    "compare_values",
    "object_items",
    "resolve_path",
]

Scalar: TypeAlias = bool | int | float | str | bytes | None
"""A literal a query may hold: what a ``?`` placeholder may be bound to."""

INT_MIN: Final = -(2**63)
"""Smallest integer a query literal or argument may hold (64-bit signed)."""
INT_MAX: Final = 2**63 - 1
"""Largest integer a query literal or argument may hold (64-bit signed)."""
MAX_VALUE_DEPTH: Final = 64
"""Deepest container nesting that comparison and key encoding accept."""


class Collation(enum.IntEnum):
    """The collation classes, numbered in collation order."""

    NULL = 0
    BOOL = 1
    NUMBER = 2
    STRING = 3
    BYTES = 4
    LIST = 5
    OBJECT = 6


ORDERED_CLASSES: Final = frozenset(
    {Collation.BOOL, Collation.NUMBER, Collation.STRING, Collation.BYTES}
)
"""The classes between which ``<``, ``<=``, ``>`` and ``>=`` can be true."""


def class_of(value: object) -> Collation:
    """The collation class of ``value``; raises InvalidArgument outside the value model."""
    if value is None:
        return Collation.NULL
    # bool before int: True is an int in Python but a bool here (never equal to 1).
    if isinstance(value, bool):
        return Collation.BOOL
    if isinstance(value, int):
        return Collation.NUMBER
    if isinstance(value, float):
        return Collation.NULL if math.isnan(value) else Collation.NUMBER
    if isinstance(value, str):
        return Collation.STRING
    if isinstance(value, bytes | bytearray):
        return Collation.BYTES
    if isinstance(value, list | tuple):
        return Collation.LIST
    if isinstance(value, Mapping):
        return Collation.OBJECT
    raise InvalidArgument(f"{type(value).__name__} is not a value a query can compare")


def compare_values(left: object, right: object) -> int:
    """-1, 0 or 1 as ``left`` collates before, equal to or after ``right``.

    Total over the value model (see the module docstring); raises InvalidArgument for
    anything outside it.
    """
    return _compare(left, right, 0)


def _compare(left: object, right: object, depth: int) -> int:
    if depth > MAX_VALUE_DEPTH:
        raise InvalidArgument(f"value nests deeper than {MAX_VALUE_DEPTH} levels")
    left_class, right_class = class_of(left), class_of(right)
    if left_class is not right_class:
        return -1 if left_class < right_class else 1
    if left_class is Collation.NULL:
        return 0
    if left_class is Collation.LIST:
        return _compare_lists(left, right, depth)
    if left_class is Collation.OBJECT:
        assert isinstance(left, Mapping)
        assert isinstance(right, Mapping)
        return _compare_objects(left, right, depth)
    return _compare_scalars(left, right)


def _compare_scalars(left: Any, right: Any) -> int:
    # Same class: bool/bool, number/number (exact across int and float), str/str (code
    # points), bytes/bytes (lexicographic); Python's operators are the collation here.
    return int(left > right) - int(left < right)


def _compare_lists(left: Any, right: Any, depth: int) -> int:
    for left_item, right_item in zip(left, right, strict=False):
        order = _compare(left_item, right_item, depth + 1)
        if order:
            return order
    return (len(left) > len(right)) - (len(left) < len(right))


def _compare_objects(left: Mapping[Any, Any], right: Mapping[Any, Any], depth: int) -> int:
    left_items, right_items = object_items(left), object_items(right)
    for (left_key, left_value), (right_key, right_value) in zip(
        left_items, right_items, strict=False
    ):
        if left_key != right_key:
            return -1 if left_key < right_key else 1
        order = _compare(left_value, right_value, depth + 1)
        if order:
            return order
    return (len(left_items) > len(right_items)) - (len(left_items) < len(right_items))


def object_items(value: Mapping[Any, Any]) -> list[tuple[str, object]]:
    """An object's (key, value) pairs sorted by key; raises InvalidArgument for a non-str key."""
    for key in value:
        if not isinstance(key, str):
            raise InvalidArgument(f"object keys must be strings, got {type(key).__name__}")
    return sorted(value.items())


def resolve_path(values: Mapping[str, object], path: tuple[str, ...]) -> object:
    """The value at ``path``: ``values[path[0]]``, then one object key per further segment.

    A missing field, a missing key, or a segment applied to anything but an object (a list,
    a string, null ...) gives ``None``: paths never index into lists.
    """
    current: object = values.get(path[0])
    for segment in path[1:]:
        if not isinstance(current, Mapping):
            return None
        current = current.get(segment)
    return current
