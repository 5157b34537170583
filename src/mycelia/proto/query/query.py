"""A parsed query: predicate, ORDER BY and LIMIT, with its placeholders and canonical text.

Invariants:

- A ``Query`` is immutable. Its placeholders are numbered 0..n-1 in text order (predicate
  first, LIMIT last) and ``placeholders`` is n; a query built by hand is checked for that.
- :meth:`Query.bind` is the only way arguments enter a query: it substitutes values into
  the AST (never into text), checks each one, and returns a query with no placeholders.
- ``parse(q.to_text()) == q`` for every query ``q``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Final

from mycelia.errors import InvalidArgument
from mycelia.proto.query.syntax import (
    And,
    Comparison,
    Const,
    In,
    Not,
    Or,
    OrderKey,
    Placeholder,
    Predicate,
    check_literal,
    iter_placeholders,
    paths,
)
from mycelia.proto.query.text import format_query
from mycelia.proto.query.values import INT_MAX, Scalar

__all__ = ["MATCH_ALL", "Query"]

_EVERYTHING: Final = Const(True)


@dataclass(frozen=True, slots=True)
class Query:
    """A query: which rows (``predicate``), in what order (``order_by``), how many (``limit``).

    ``order_by`` ties are broken by entity id, ascending; ``limit`` applies after ordering.
    """

    predicate: Predicate = _EVERYTHING
    order_by: tuple[OrderKey, ...] = ()
    limit: int | Placeholder | None = None
    placeholders: int = field(init=False)
    """How many ``?`` the query holds (arguments :meth:`bind` needs)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "order_by", tuple(self.order_by))
        if not isinstance(self.limit, Placeholder | None):
            object.__setattr__(self, "limit", _check_limit(self.limit, what="LIMIT"))
        found = list(iter_placeholders(self.predicate))
        if isinstance(self.limit, Placeholder):
            found.append(self.limit)
        if [placeholder.index for placeholder in found] != list(range(len(found))):
            raise InvalidArgument("placeholders must be numbered 0, 1, ... in text order")
        object.__setattr__(self, "placeholders", len(found))

    def bind(self, *args: object) -> Query:
        """This query with every ``?`` replaced by ``args`` in order.

        Raises InvalidArgument if the count differs from :attr:`placeholders`, or an
        argument is not a query value (see ``check_literal``: None, bool, 64-bit int, finite
        float, str, bytes) or, for LIMIT, not a non-negative int.
        """
        if len(args) != self.placeholders:
            raise InvalidArgument(
                f"the query has {self.placeholders} ? placeholder(s) but was given "
                f"{len(args)} argument(s): pass one value per ?, in order"
            )
        if not args:
            return self
        limit = self.limit
        if isinstance(limit, Placeholder):
            limit = _check_limit(args[limit.index], what=f"argument {limit.index + 1} (LIMIT)")
        values = tuple(
            check_literal(arg, what=f"argument {index + 1}") for index, arg in enumerate(args)
        )
        return replace(self, predicate=_substitute(self.predicate, values), limit=limit)

    def to_text(self) -> str:
        """The canonical text; ``parse(q.to_text()) == q``."""
        return format_query(self.predicate, self.order_by, self.limit)

    def fields(self) -> frozenset[str]:
        """The top-level field names the predicate and ORDER BY read."""
        read = {path[0] for path in paths(self.predicate)}
        read.update(key.path[0] for key in self.order_by)
        return frozenset(read)

    def __str__(self) -> str:
        return self.to_text()


MATCH_ALL: Final = Query()
"""The query that matches every row, unordered (by id), unlimited: ``parse("")``."""


def _check_limit(value: object, *, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= INT_MAX:
        raise InvalidArgument(f"{what} must be a non-negative 64-bit integer, got {value!r}")
    return int(value)


def _bind_value(value: Scalar | Placeholder, values: tuple[Scalar, ...]) -> Scalar:
    return values[value.index] if isinstance(value, Placeholder) else value


def _substitute(predicate: Predicate, values: tuple[Scalar, ...]) -> Predicate:
    if isinstance(predicate, Comparison) and isinstance(predicate.value, Placeholder):
        return replace(predicate, value=values[predicate.value.index])
    if isinstance(predicate, In):
        return replace(predicate, values=tuple(_bind_value(v, values) for v in predicate.values))
    if isinstance(predicate, And | Or):
        return replace(predicate, items=tuple(_substitute(i, values) for i in predicate.items))
    if isinstance(predicate, Not):
        return Not(_substitute(predicate.item, values))
    return predicate
