"""One write transaction of the PostgreSQL engine: its statements, run on one connection
(ARCHITECTURE.md §6; :meth:`mycelia.storage.postgres.PostgresStorage.write` runs them
pipelined, in this order).

Invariants:

- Writers take their locks in one order: events by id, states by entity, the feed clock
  last (``append_feed``, the transaction's last statement that takes a lock, queued for
  by the ``feed_lock`` statement just before), so concurrent writers
  never deadlock on their own; one aborted anyway is run again whole.
- **Reading an entity's head and writing its state are one serialisable step.** Each
  stored state's row is locked (``SELECT ... FOR UPDATE``) before it is written; a new
  entity's row is inserted first, so a writer racing to create it waits, then locks it.
  Where the stored head is not in the written state's history, the join of both is
  stored instead (:mod:`mycelia.storage.join`), and the feed row names it.
- A state's ``field_keys`` rows are replaced whole with it, so the field index never
  disagrees with the states a reader sees.
- ``write_batch`` (the SQL function, :func:`write_batch_params`) is the whole transaction in
  one statement, for a batch whose every state names the stored head it was made on: it
  locks and updates each state's row only where the stored ``head`` still equals that
  base (an empty base: inserts, where no row exists), and otherwise raises
  :data:`~mycelia.storage.postgres_sql.HEAD_MOVED` and writes nothing. The state then
  descends from the stored one, so it needs no join. It takes events, then states, then
  the feed clock; the rows of a batch of several states it locks in the join's order, not
  by entity, so two such batches may deadlock, and the one PostgreSQL aborts runs again.
- The cursors these methods return are read after the commit (pipelined statements):
  :func:`new_ids` for the events that were new, :func:`offsets` for the feed offsets.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final

import psycopg
from psycopg import sql

from mycelia.proto import AdmittedEvent, EntityState, EventId
from mycelia.retrieval import StoredState, WriteBatch
from mycelia.storage.join import covers, join_stored
from mycelia.storage.postgres_arrays import Bigints, Bytea, Texts
from mycelia.storage.postgres_notice import notice
from mycelia.storage.postgres_sql import (
    HEAD_MOVED,
    StateRow,
    admitted,
    decode_state,
    key_columns,
    state_row,
)

__all__ = [
    "WriteTransaction",
    "event_columns",
    "events_query",
    "new_ids",
    "offsets",
    "write_at_once",
    "write_batch_params",
]

log = logging.getLogger(__name__)

_RECENT: Final = 4096
"""Most recent events of an entity read at once to join a concurrent write."""
_JOIN_AHEAD: Final = 8
"""Most ancestors read ahead per step of a join's comparison (see ``_Events``)."""


async def new_ids(cursor: psycopg.AsyncCursor[Any]) -> frozenset[EventId]:
    """The ids an ``insert_events`` statement inserted (the others were stored before)."""
    return frozenset(EventId._trusted(r[0]) for r in await cursor.fetchall())


async def offsets(cursor: psycopg.AsyncCursor[Any], count: int) -> tuple[int, ...]:
    """The ``count`` offsets an ``append_feed`` statement took, from its last one."""
    row = await cursor.fetchone()
    assert row is not None
    last = int(row[0])
    return tuple(range(last - count + 1, last + 1))


def _state_columns(rows: Sequence[StateRow]) -> list[list[Any]]:
    """The ``upsert_states`` / ``insert_new_states`` parameters: one array per column."""
    return [
        Bytea([r[0] for r in rows]),
        Texts([r[1] for r in rows]),
        Bytea([r[2] for r in rows]),
        Bytea([r[3] for r in rows]),
        Texts([r[4] for r in rows]),
        Bytea([r[5] for r in rows]),
    ]


def write_batch_params(
    batch: WriteBatch, rows: Sequence[StateRow], *, channel: str, writer: str
) -> list[Any] | None:
    """The parameters of the ``write_batch`` statement for ``batch`` (its encoded state
    ``rows``), or ``None`` when it cannot write the batch: it writes events and the states
    of distinct entities, each made on a known base (``batch.bases``), with no meta and
    nothing forgotten. It raises :data:`HEAD_MOVED`, writing nothing, unless every stored
    head still equals its state's base (an empty base: no state stored yet), so that every
    state it writes descends from the stored one and no join is needed."""
    if batch.meta or batch.forget or not rows:
        return None
    bases = {bytes(e): b"".join(head.ids) for e, head in batch.bases.items()}
    entities = [r[0] for r in rows]
    if len(set(entities)) != len(entities) or not all(e in bases for e in entities):
        return None
    ordered = sorted(batch.events, key=lambda e: e.id)  # one order for every writer's locks
    keys = key_columns([(r[0], r[1], r[6]) for r in rows])
    return [
        *event_columns(ordered),
        *_state_columns(rows),
        Bytea([bases[e] for e in entities]),
        *keys,
        channel,
        notice(writer, [(r[0], r[1], r[5]) for r in rows], batch.events),
    ]


def events_query(ids: Collection[EventId], ahead: int) -> tuple[str, Any]:
    """The statement and parameters that read ``ids`` (plus ``ahead`` ancestors)."""
    wanted = Bytea([bytes(i) for i in ids])
    if ahead > 0:
        return "ahead", {"ids": wanted, "n": len(wanted) + ahead}
    return "events", (wanted,)


def event_columns(events: Sequence[AdmittedEvent]) -> list[list[Any]]:
    """The ``insert_events`` parameters: one array per column."""
    return [
        Bytea([bytes(e.id) for e in events]),
        Bytea([bytes(e.entity_id) for e in events]),
        Bigints([e.generation for e in events]),
        Bytea([b"".join(e.parent.ids) for e in events]),
        Bytea([e.event.to_bytes() for e in events]),
    ]


async def write_at_once(
    conn: psycopg.AsyncConnection[Any], statement: sql.Composed, params: list[Any]
) -> tuple[frozenset[EventId], int] | None:
    """Run ``write_batch`` on ``conn`` (in autocommit: the statement is its transaction);
    returns the new events and the last feed offset taken, or ``None`` if a stored head
    moved (nothing was written then)."""
    try:
        cursor = await conn.execute(statement, params)
    except psycopg.DatabaseError as exc:
        if exc.sqlstate == HEAD_MOVED:
            return None
        raise
    row = await cursor.fetchone()
    assert row is not None
    return frozenset(EventId._trusted(i) for i in row[0] or ()), int(row[1])


class WriteTransaction:
    """The statements of one write transaction on ``conn`` (opened by the caller)."""

    __slots__ = ("_channel", "_conn", "_q", "_writer")

    def __init__(
        self,
        conn: psycopg.AsyncConnection[Any],
        queries: Mapping[str, sql.Composed],
        *,
        channel: str,
        writer: str,
    ) -> None:
        self._conn = conn
        self._q = queries
        self._channel, self._writer = channel, writer
        """The feed's NOTIFY channel, and the id that signs this engine's notifications
        (it ignores its own)."""

    async def forget(self, entities: Collection[bytes]) -> None:
        """Delete ``entities`` whole: their events, state, field keys."""
        await self._conn.execute(self._q["forget"], {"ids": list(entities)})

    async def insert_events(
        self, events: Sequence[AdmittedEvent]
    ) -> psycopg.AsyncCursor[Any] | None:
        """Insert ``events``; the cursor's rows (read after the commit) are the new ids."""
        if not events:
            return None
        ordered = sorted(events, key=lambda e: e.id)  # one order for every writer's index locks
        return await self._conn.execute(self._q["insert_events"], event_columns(ordered))

    async def lock_and_join(
        self, batch: WriteBatch, rows: list[StateRow]
    ) -> tuple[list[StateRow], set[bytes]]:
        """``rows`` with each stored state's row locked (in entity order) and, where
        another process stored a state the batch's does not descend from, the join of
        both in its place (the feed row then names the joined head); and the entities
        that had no stored state, whose rows are inserted here (so a racing writer of
        the same new entity waits for this one, then joins)."""
        inserted: set[bytes] = set()
        if not rows:
            return rows, inserted
        latest = {r[0]: r for r in rows}  # an entity written twice in a batch keeps the last
        order = sorted(latest)
        locked = await self._lock_states(order)
        fresh = [latest[e] for e in order if e not in locked]
        if fresh:
            cursor = await self._conn.execute(self._q["insert_new_states"], _state_columns(fresh))
            inserted = {bytes(r[0]) for r in await cursor.fetchall()}
            raced = [r[0] for r in fresh if r[0] not in inserted]  # committed meanwhile
            if raced:
                again = await (
                    await self._conn.execute(self._q["lock_states"], (raced,))
                ).fetchall()
                locked.update((bytes(e), raw) for e, raw in again)
        if locked:
            written = {bytes(s.state.entity_id): s for s in batch.states}
            for entity, raw in sorted(locked.items()):
                own = {e.id: e for e in batch.events if bytes(e.entity_id) == entity}
                joined = await self._join(decode_state(raw), written[entity], own)
                if joined is not None:
                    latest[entity] = state_row(joined)
        last = {r[0]: i for i, r in enumerate(rows)}
        joined_rows = [latest[r[0]] if last[r[0]] == i else r for i, r in enumerate(rows)]
        return joined_rows, inserted

    async def _lock_states(self, entities: list[bytes]) -> dict[bytes, bytes]:
        """Lock the stored states of ``entities`` (sorted: one order for every writer);
        returns each stored one's encoded state."""
        cursor = await self._conn.execute(self._q["lock_states"], (entities,))
        return {bytes(e): raw for e, raw in await cursor.fetchall()}

    async def _join(
        self,
        stored: EntityState,
        written: StoredState,
        own: dict[EventId, AdmittedEvent],
    ) -> StoredState | None:
        """:func:`join_stored` in the write's transaction. When the batch's own events do
        not show that the stored head is in the written history, the entity's recent
        events (from just below the batch's) are read in one query first: the region a
        comparison would walk, without a round trip per step."""
        head = written.state.state.head
        if covers(head, stored.state.head, own):
            return None
        gens = [
            *stored.state.head_generations().values(),
            *written.state.state.head_generations().values(),
        ]
        floor = min([e.generation for e in own.values()] + gens) - 1
        params = {"entity": bytes(stored.entity_id), "floor": floor, "n": _RECENT}
        rows = await (await self._conn.execute(self._q["recent"], params, binary=True)).fetchall()
        known = {e.id: e for e in map(admitted, rows)} | own
        joined = await join_stored(stored, written, known, _Events(self._q, self._conn))
        if joined is not None:
            log.debug("joined a concurrent write of entity %s", stored.entity_id)
        return joined

    async def insert_states(
        self,
        rows: list[StateRow],
        *,
        inserted: Collection[bytes] = (),
        events: Sequence[AdmittedEvent] = (),
    ) -> psycopg.AsyncCursor[Any] | None:
        """Store ``rows`` (their field keys replaced whole) and append their feed rows;
        the states of ``inserted`` entities are in place already; the NOTIFY says those
        of ``events`` their heads name. The cursor's row (read after the commit,
        :func:`offsets`) holds the last offset taken."""
        if not rows:
            return None
        latest = {r[0]: r for r in rows}  # an entity written twice in a batch keeps the last
        stale = [r for e, r in latest.items() if e not in inserted]
        if stale:
            await self._conn.execute(self._q["upsert_states"], _state_columns(stale))
        await self._conn.execute(self._q["delete_keys"], (list(latest),))
        keys = [(r[0], r[1], r[6]) for r in latest.values() if r[6]]
        if keys:
            await self._conn.execute(self._q["insert_keys"], key_columns(keys))
        feed = {
            "e": Bytea([r[0] for r in rows]),
            "c": Texts([r[1] for r in rows]),
            "h": Bytea([r[5] for r in rows]),
            "channel": self._channel,
            "writer": notice(self._writer, [(r[0], r[1], r[5]) for r in rows], events),
        }
        await self._conn.execute(self._q["feed_lock"])  # queue for the feed clock (see feed_lock)
        return await self._conn.execute(self._q["append_feed"], feed)

    async def write_meta(self, meta: Sequence[tuple[str, bytes | None]]) -> None:
        final = dict(meta)  # the last write of a key wins, as in every engine
        puts = {k: v for k, v in final.items() if v is not None}
        gone = [k for k, v in final.items() if v is None]
        if puts:
            await self._conn.execute(self._q["put_meta"], (list(puts), list(puts.values())))
        if gone:
            await self._conn.execute(self._q["delete_meta"], (gone,))


class _Events:
    """Events as one write's transaction sees them, its own included (for joins).

    Read-ahead is capped: the join reads the entity's recent events first, so a walk
    rarely goes beyond them, and ancestors read ahead below them would be decoded for
    nothing."""

    __slots__ = ("_conn", "_queries")

    def __init__(self, queries: Mapping[str, sql.Composed], conn: psycopg.AsyncConnection[Any]):
        self._queries = queries
        self._conn = conn

    async def get_events(
        self, ids: Collection[EventId], *, ahead: int = 0
    ) -> Mapping[EventId, AdmittedEvent]:
        if not ids:
            return {}
        name, params = events_query(ids, min(ahead, _JOIN_AHEAD))
        cursor = await self._conn.execute(self._queries[name], params, binary=True)
        return {e.id: e for e in map(admitted, await cursor.fetchall())}
