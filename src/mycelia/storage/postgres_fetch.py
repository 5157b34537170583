"""PostgreSQL's ``fetch`` (ARCHITECTURE.md §6, §8): :class:`QueryReader` is the part of
:class:`~mycelia.storage.postgres.PostgresStorage` that runs queries; the statements and
row helpers are :mod:`mycelia.storage.postgres_sql`'s.

Invariants:

- ``fetch`` returns exactly ``sort_rows`` over ``scan`` (after the position ``after``):
  what maps exactly is pushed down (one indexed range or set of keys, as parameters: see
  :mod:`mycelia.storage.plan`), the field's long entries are added (kept if their
  recomputed key is in range), the whole predicate is evaluated in Python on the
  candidates, and the order is either the index's with the long rows merged in (ordered
  plans with a LIMIT, read through a server-side cursor until LIMIT rows matched, from
  the position ``after`` on: a ``*_from`` statement) or ``sort_rows``'s.
- A query without ORDER BY and with a LIMIT, and nothing indexable, walks the
  collection's ids ascending from ``after`` (``states_by_collection``) until LIMIT rows
  matched: a page of a keyset-paged answer reads about its own rows.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from mycelia.proto.query import After, Query
from mycelia.retrieval import StoredState
from mycelia.storage.plan import IndexPlan, check_bound, first_id, matches_nothing, plan_query
from mycelia.storage.postgres_pool import translate
from mycelia.storage.postgres_sql import (
    from_position,
    long_rows,
    matching,
    merge_rows,
    rows_after,
    sorted_states,
)

__all__ = ["QueryReader"]

Read = Callable[[str, Sequence[Any]], Awaitable[list[tuple[Any, ...]]]]
"""Run a named statement and return all its rows."""


class QueryReader:
    """Runs ``fetch`` for a PostgreSQL engine (see the module docstring)."""

    def __init__(
        self,
        read: Read,
        ready: Callable[[], Awaitable[AsyncConnectionPool[Any]]],
        statements: Mapping[str, sql.Composed],
    ) -> None:
        self._read = read
        self._ready = ready
        self._statements = statements

    async def fetch(
        self, collection: str, query: Query, *, after: After | None = None
    ) -> list[StoredState]:
        """The states of ``collection`` matching the bound ``query``, in its order, at most
        its limit (after the position ``after``; see the module docstring).

        Raises InvalidArgument if the query has placeholders.
        """
        check_bound(query)
        plan = plan_query(query)
        if matches_nothing(query, plan):
            return []
        first = first_id(query, after)
        keys: tuple[object, ...]
        if plan is not None and all(r.point for r in plan.ranges):
            span, keys = "points", ([r.low for r in plan.ranges],)
        elif plan is not None and len(plan.ranges) == 1:
            span, keys = "range", (plan.ranges[0].low, plan.ranges[0].high)
        elif query.order_by or query.limit is None:  # nothing indexable: read the collection
            if first is None:
                rows = await self._read("rows", (collection,))
            else:
                rows = await self._read("rows_after", (collection, first))
            return sorted_states(rows, query, after)
        else:  # in id order up to the limit: walk the collection's ids
            return await self._walk("rows_after", (collection, first or b""), query, None)
        head = (collection, plan.field.encode("utf-8", "surrogatepass"))
        long = rows_after(long_rows(await self._read("long_", head), plan), first)
        if not plan.ordered or query.limit is None:
            rows = rows_after(await self._read(f"{span}_", (*head, *keys)), first)
            return sorted_states([*rows, *long], query, after)
        order = "desc" if plan.descending else "asc"
        if after is None:
            name, params = f"{span}_{order}", (*head, *keys)
        else:  # the walk starts at the position; the long rows after it are merged in
            name, params = f"{span}_{order}_from", (*head, *keys, *from_position(plan, after))
            long = [row for row in long if plan.walk_key(row[1], bytes(row[0])) > after]
        return await self._walk(name, params, query, (plan, deque(long)))

    async def _walk(
        self,
        name: str,
        params: Sequence[Any],
        query: Query,
        merge: tuple[IndexPlan, deque[tuple[Any, ...]]] | None,
    ) -> list[StoredState]:
        """Read candidates in the query's order through a server-side cursor, in growing
        chunks, merged with the plan's long rows, until ``query.limit`` of them match."""
        limit = query.limit
        assert isinstance(limit, int)
        pending: deque[tuple[Any, ...]] = deque() if merge is None else merge[1]
        pool = await self._ready()
        found: list[StoredState] = []
        try:
            async with (
                pool.connection() as conn,
                conn.transaction(),
                conn.cursor("mycelia_fetch", binary=True) as cursor,
            ):
                await cursor.execute(self._statements[name], params)
                size = max(2 * limit, 16)
                while len(found) < limit and (rows := await cursor.fetchmany(size)):
                    ordered = rows if merge is None else merge_rows(rows, pending, merge[0])
                    found.extend(matching(ordered, query, limit - len(found)))
                    size = min(4 * size, 4096)
        except (psycopg.Error, PoolTimeout) as exc:
            raise translate(exc, f"PostgreSQL read ({name}) failed") from exc
        if len(found) < limit:
            found.extend(matching(list(pending), query, limit - len(found)))
        return found
