"""The PostgreSQL engine's writes: a batch in one transaction, and a dump loaded in one
(ARCHITECTURE.md §6). :class:`Writer` is the part of
:class:`~mycelia.storage.postgres.PostgresStorage` that writes; the statements it runs are
:mod:`mycelia.storage.postgres_write`'s, the grouping :mod:`mycelia.storage.postgres_group`'s.

Invariants:

- Every write batch is **one transaction**: events, states and their ``field_keys`` rows,
  feed rows, meta. A batch whose states were all made on the heads still stored
  (``batch.bases``) is that transaction in one statement (``write_batch``, a
  compare-and-set on ``head``), at first shared with the writes in flight beside it
  (:class:`~mycelia.storage.postgres_group.GroupCommit`); when a stored head moved that
  statement wrote nothing, and the batch is written by the row-locked, joining
  transaction (:class:`~mycelia.storage.postgres_write.WriteTransaction`) however often it
  runs again.
- A transaction that PostgreSQL aborts to break a deadlock (or for a serialisation
  failure) wrote nothing and is run again, up to five runs in all (``_ATTEMPTS``); every other
  psycopg error, and a pool timeout, is translated
  (:func:`~mycelia.storage.postgres_pool.translate`) and the batch is not written. A batch
  that cannot be encoded fails before any I/O.
- Only a write that returned is made known: its events join the recent events, its feed
  rows the rows the listener keeps (so a follower's read of its own commits costs no
  query), and its last offset wakes this engine's waiters. A batch that forgets entities
  lets go of their recent events before anything is written.
- A load is **all or nothing**: the stream is staged in an unlinked temporary file
  (:mod:`mycelia.storage.staging`) while it is read, with no transaction open, then
  written in one transaction that first locks the feed clock's row and refuses the load
  if the feed is no longer at ``if_offset``; its last offset then wakes the waiters.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, cast

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from mycelia.proto import EntityId, EventId
from mycelia.retrieval import WriteBatch, WriteResult
from mycelia.storage.engine import DumpRecord, FeedEntry
from mycelia.storage.postgres_group import GroupCommit
from mycelia.storage.postgres_listen import FeedListener
from mycelia.storage.postgres_pool import translate
from mycelia.storage.postgres_sql import StateRow, clock, state_rows
from mycelia.storage.postgres_write import (
    WriteTransaction,
    event_columns,
    new_ids,
    offsets,
    write_at_once,
    write_batch_params,
)
from mycelia.storage.recent import RecentEvents
from mycelia.storage.staging import Spill, load_batches, stale_load

__all__ = ["Writer"]

log = logging.getLogger(__name__)

_Written = tuple[frozenset[EventId], tuple[int, ...], list[StateRow]]
"""What a write did: the new events, the feed offsets taken, and the state rows written
(joined ones where another process wrote the entity meanwhile)."""
_ATTEMPTS: Final = 5
"""Runs of a write transaction that PostgreSQL aborted to break a deadlock."""


class Writer:
    """The writes of one :class:`~mycelia.storage.postgres.PostgresStorage` (see the
    module docstring): it reaches the server through ``ready``, the engine's pool."""

    def __init__(
        self,
        ready: Callable[[], Awaitable[AsyncConnectionPool[Any]]],
        queries: Mapping[str, sql.Composed],
        *,
        channel: str,
        recent: RecentEvents,
        listener: FeedListener,
    ) -> None:
        self._ready = ready
        self._q = queries
        self.channel = channel
        self._recent = recent
        self._listener = listener
        self._groups = GroupCommit(self._run_write_batch, self._batch_params)

    # ------------------------------------------------------------------ load

    async def load(
        self, records: AsyncIterable[DumpRecord], *, if_offset: int | None = None
    ) -> int:
        """Write a dump stream all or nothing; returns how many events it held.

        The rows are staged in an unlinked temporary file while the stream is read (no
        transaction is open meanwhile), then written in **one transaction** that first
        locks the feed clock and checks ``if_offset`` (see the module docstring).
        """
        total, last = 0, 0
        with Spill() as spill:
            async for batch in load_batches(records):
                total += len(batch.events)
                staged = [event_columns(batch.events), state_rows(batch), list(batch.meta)]
                await asyncio.to_thread(spill.append, staged)
            pool = await self._ready()
            try:
                async with pool.connection() as conn, conn.transaction():
                    await self._lock_feed(conn, if_offset)
                    txn = self._transaction(conn)
                    for item in spill.items():
                        events, states, meta = cast("list[Any]", item)
                        if events[0]:
                            await conn.execute(self._q["insert_events"], events)
                        feed = await txn.insert_states(states)
                        if feed is not None:
                            last = (await offsets(feed, 1))[0]
                        await txn.write_meta(meta)
            except (psycopg.Error, PoolTimeout) as exc:
                raise translate(exc, "PostgreSQL load failed") from exc
        if last:
            self._listener.announce(last)
        return total

    async def _lock_feed(self, conn: psycopg.AsyncConnection[Any], if_offset: int | None) -> None:
        """Take the feed clock's row lock (held to commit: no state is written meanwhile)
        and refuse the load if the feed moved since ``if_offset``."""
        cursor = await conn.execute(self._q["lock_clock"])
        row = await cursor.fetchone()
        assert row is not None
        if if_offset is not None and int(row[0]) != if_offset:
            raise stale_load(if_offset, int(row[0]))

    # ------------------------------------------------------------------ writes

    async def write(self, batch: WriteBatch) -> WriteResult:
        """Make ``batch`` durable in one transaction; raises StorageError, writing nothing.

        A batch whose states were all made on the heads still stored (``batch.bases``) is
        written by one statement, ``write_batch``: one round trip, its commit included.
        Otherwise (or when a stored head moved meanwhile: that statement then writes
        nothing) each state is written under its row lock, joined with a state another
        process stored meanwhile (:mod:`mycelia.storage.join`), in pipelined statements:
        two round trips, three with a join. A transaction that PostgreSQL aborts to break
        a deadlock between writers is run again (it wrote nothing).
        """
        states = state_rows(batch)  # encodes first: a bad state fails before any I/O
        if not (batch.events or states or batch.meta or batch.forget):
            await self._ready()
            return WriteResult(frozenset(), ())
        pool = await self._ready()
        if batch.forget:
            self._recent.forget_entities(frozenset(batch.forget))
        at_once = self._batch_params(batch, states)
        done: _Written | None = None
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                if at_once is not None:
                    done = await self._write_at_once(pool, at_once, batch, states, attempt)
                if done is None:
                    at_once = None  # a stored head moved: this batch joins, however often it runs
                    done = await self._write_joining(pool, batch, states)
                break
            except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure) as exc:
                if attempt == _ATTEMPTS:
                    raise translate(exc, "PostgreSQL write failed") from exc
                log.info("PostgreSQL write aborted (%s); running it again", exc)
            except (psycopg.Error, PoolTimeout) as exc:
                raise translate(exc, "PostgreSQL write failed") from exc
        assert done is not None  # the loop ends by a write or raises
        new, taken, rows = done
        self._recent.remember(batch.events)
        if taken:
            self._note_written(rows, taken)
            self._listener.announce(taken[-1])
        return WriteResult(new, taken)

    async def _write_at_once(
        self,
        pool: AsyncConnectionPool[Any],
        params: list[Any],
        batch: WriteBatch,
        states: list[StateRow],
        attempt: int,
    ) -> _Written | None:
        """``write_batch`` (None: a stored head moved, nothing was written): at first with
        the writes in flight beside it (:mod:`mycelia.storage.postgres_group`), alone
        when run again after PostgreSQL aborted it."""
        if attempt == 1:
            grouped = await self._groups.write(batch, states, params)
            return None if grouped is None else (*grouped, states)
        written = await self._run_write_batch(params, pool)
        if written is None:
            return None
        new, last = written
        return new, tuple(range(last - len(states) + 1, last + 1)), states

    async def _run_write_batch(
        self, params: list[Any], pool: AsyncConnectionPool[Any] | None = None
    ) -> tuple[frozenset[EventId], int] | None:
        """One ``write_batch`` statement (see :func:`write_at_once`)."""
        pool = pool or await self._ready()
        async with pool.connection() as conn:
            return await write_at_once(conn, self._q["write_batch"], params)

    async def _write_joining(
        self, pool: AsyncConnectionPool[Any], batch: WriteBatch, states: list[StateRow]
    ) -> _Written:
        """The row-locked transaction, pipelined: each state joined with one another
        process stored meanwhile; returns the rows actually written too."""
        async with pool.connection() as conn:
            async with conn.pipeline(), conn.transaction():
                txn = self._transaction(conn)
                if batch.forget:
                    await txn.forget([bytes(e) for e in batch.forget])
                added = await txn.insert_events(batch.events)
                rows, inserted = await txn.lock_and_join(batch, states)
                feed = await txn.insert_states(rows, inserted=inserted, events=batch.events)
                await txn.write_meta(batch.meta)
            new = frozenset() if added is None else await new_ids(added)
            taken = () if feed is None else await offsets(feed, len(rows))
        return new, taken, rows

    def _batch_params(self, batch: WriteBatch, states: Sequence[StateRow]) -> list[Any] | None:
        return write_batch_params(batch, states, channel=self.channel, writer=self._listener.writer)

    def _transaction(self, conn: psycopg.AsyncConnection[Any]) -> WriteTransaction:
        return WriteTransaction(conn, self._q, channel=self.channel, writer=self._listener.writer)

    def _note_written(self, rows: Sequence[StateRow], offsets: Sequence[int]) -> None:
        """Keep this write's feed rows with those heard of: a follower's read of them (its
        own commits) costs no query."""
        self._listener.keep(
            FeedEntry(offset, EntityId._trusted(row[0]), row[1], clock(row[5]))
            for row, offset in zip(rows, offsets, strict=True)
        )

    async def close(self) -> None:
        """Finish the groups of writes queued."""
        await self._groups.close()
