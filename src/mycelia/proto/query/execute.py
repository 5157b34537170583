"""The in-memory executor: predicate, ORDER BY (entity id as the last tiebreak), LIMIT.

Invariants:

- :func:`sort_rows` is the reference result of a query over a set of rows; every storage
  engine's pushdown must return exactly its list (the shared case file pins it). It
  evaluates the compiled form of the predicate, which a property test holds equal to
  :func:`~mycelia.proto.query.evaluate.evaluate`.
- Rows are ordered by their :func:`~mycelia.proto.query.keys.order_key` bytes, then by id
  bytes ascending; LIMIT keeps the first ``limit`` rows of that order, and holds no more
  than that many of the rows while it reads them.
- An :class:`After` is a keyset position in that order: with one, only the rows whose
  (order key, id) sorts after it are kept, before LIMIT. Reading a result a page at a time,
  each page's last row (:meth:`After.row`) is the next page's position; a row sorts after
  its own position, so nothing is read twice and, while nothing changes, nothing skipped.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import NamedTuple, TypeVar

from mycelia.errors import InvalidArgument
from mycelia.proto.query.compile import compile_predicate
from mycelia.proto.query.keys import order_key
from mycelia.proto.query.query import Query
from mycelia.proto.query.syntax import Placeholder

__all__ = ["After", "sort_rows"]

IdT = TypeVar("IdT", bound=bytes)
RowT = TypeVar("RowT", bound=Mapping[str, object])


class After(NamedTuple):
    """A keyset position in a query's order (see the module docstring): the rows after it
    are those whose (ORDER BY key, id bytes) sorts after (``key``, ``entity_id``). Without
    ORDER BY every row's key is empty, so ``After(b"", id)`` means the ids after ``id``."""

    key: bytes
    entity_id: bytes

    @classmethod
    def row(cls, query: Query, row_id: bytes, values: Mapping[str, object]) -> After:
        """The position of one row of ``query``'s result: the next page starts after it."""
        return cls(order_key(values, query.order_by), bytes(row_id))


def sort_rows(
    rows: Iterable[tuple[IdT, RowT]], query: Query, *, after: After | None = None
) -> list[tuple[IdT, RowT]]:
    """The ``(id, values)`` rows matching ``query``, in its order, at most ``limit`` of them
    (of those after ``after`` only, when given).

    Raises InvalidArgument if ``query`` still has placeholders (bind it first) or a row holds
    a value outside the value model.
    """
    if query.placeholders:
        raise InvalidArgument("the query has an unbound '?': call Query.bind first")
    matches, order_by = compile_predicate(query.predicate), query.order_by
    keyed: Iterable[tuple[bytes, bytes, IdT, RowT]] = (
        (order_key(values, order_by), bytes(row_id), row_id, values)
        for row_id, values in rows
        if matches(values)
    )
    if after is not None:
        keyed = (entry for entry in keyed if (entry[0], entry[1]) > after)
    limit = query.limit
    assert not isinstance(limit, Placeholder)
    # Taken as ``rows`` yields them: with a LIMIT only that many are held at once (an
    # engine's rows can be a whole collection read one at a time).
    if limit is None:
        ordered = sorted(keyed, key=_sort_key)
    else:
        ordered = heapq.nsmallest(limit, keyed, key=_sort_key)
    return [(row_id, values) for _, _, row_id, values in ordered]


def _sort_key(entry: tuple[bytes, bytes, object, object]) -> tuple[bytes, bytes]:
    return entry[0], entry[1]
