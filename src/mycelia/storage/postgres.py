"""``PostgresStorage``: the server engine, on PostgreSQL through psycopg 3 (ARCHITECTURE.md §6).

Opening: ``storage = await PostgresStorage(dsn).open()``. An engine that is used before
``open()`` opens itself on first use, so ``await Node.open(PostgresStorage(dsn), ...)``
works too (the first call then pays for connecting and migrating). With ``create=False``
the schema must already exist at this version: nothing is created or migrated
(StorageNotFound, StorageReadOnly otherwise), which is how ``mycelia inspect`` and
``dump`` open it.

Schema (all tables in the PostgreSQL schema named by ``schema=``, default ``mycelia``):

- ``events(id bytea PK, entity_id, generation, parents, body)`` — ``parents`` is the
  concatenated 32-byte parent ids, so read-ahead can walk ancestors in SQL; an index on
  ``(entity_id, generation, id)`` serves ``events_of`` parents first;
- ``states(entity_id PK, collection, state, values_raw, values, head)`` — ``values_raw`` is
  the exact msgpack of the values; ``values`` is a JSONB projection for SQL (bytes become
  ``{"$bytes": base64}``, non-finite floats ``{"$float": "inf"}``, NUL characters in
  strings U+FFFD — JSONB cannot hold them); ``head`` the state's head ids concatenated
  (NULL for a state last written before version 4); an index on ``(collection, entity_id)``;
- ``feed("offset" PK, entity_id, collection, head)`` and the one-row ``feed_clock(last)``;
- ``field_keys(entity_id, field, collection, key)`` (PK ``(entity_id, field)``) — one row per
  top-level field of a state holding a bool, number, string or bytes, ``key`` being
  ``encode_key(value)`` (:func:`mycelia.storage.plan.index_entries`), or NULL when that is
  longer than ``MAX_INDEXED_KEY`` (a *long* entry), ``field`` its UTF-8; a btree on
  ``(collection, field, key, entity_id)`` serves ``fetch``;
- ``meta(key PK, value)``; ``version(version)``: the schema version (2 added
  ``field_keys``; migrating to it indexes every stored state; 3 added ``node_keys``; 4 the
  states' ``head`` and the function ``write_batch``; 5 has it queue for the feed lock; 6
  lets a text state be stored as its parts, see ``EntityState.to_stored``);
- ``node_keys(name PK, key)`` — node keys kept per node name (:meth:`PostgresStorage.node_key`),
  for server processes that keep nothing on their disk. They are not part of a dump.

Invariants:

- The engine creates and migrates its schema itself, under a transaction-level advisory
  lock (``pg_advisory_xact_lock``), so processes starting together do not race the DDL. A
  database migrated by a newer engine is refused (StorageError)
  (:mod:`mycelia.storage.postgres_schema`).
- Every write batch is **one transaction**: events (``ON CONFLICT DO NOTHING ... RETURNING
  id`` tells which were new), states and their ``field_keys`` rows (replaced whole), feed
  rows, meta (:mod:`mycelia.storage.postgres_writer` runs the writes and loads;
  :mod:`mycelia.storage.postgres_write`'s invariants say how several processes committing
  to one entity at once lose no head and orphan no event). A batch whose states were all
  made on the heads still stored is that transaction in one statement (``write_batch``, a
  compare-and-set on ``head``). A transaction aborted to break a deadlock is run again.
- ``fetch`` returns exactly ``sort_rows`` over ``scan``, with what maps exactly pushed
  down to ``field_keys`` (:mod:`mycelia.storage.postgres_fetch`).
- **The feed never skips a committed batch.** Offsets are not taken from a sequence (which
  has gaps, and whose values can become visible out of order). A batch with states updates
  the ``feed_clock`` row as the last step of its transaction: the row lock serialises
  writers from that point until commit, so offsets are gap-free (a rollback gives them
  back) and a batch with higher offsets cannot commit before one with lower offsets. A
  reader that sees offset *n* therefore sees every offset below it.
- ``wait_for_feed`` wakes on ``LISTEN``/``NOTIFY`` (each batch notifies its last offset on
  commit), but treats it as a hint only: it re-reads the clock and polls every
  ``poll_interval`` seconds, so a lost notification (or a backend without NOTIFY) costs
  latency, never data (:mod:`mycelia.storage.postgres_listen`). Several processes may
  share one database and see each other's commits: the engine says so (``shared``), and a
  node on it follows its feed (:mod:`mycelia.node.feed`).
- Events never change once stored, so the events this engine wrote or read lately are
  kept decoded (:mod:`mycelia.storage.recent`, bounded in count and bytes) and read
  without a round trip; a write that forgets an entity lets go of its events first.
- :meth:`PostgresStorage.exclusive` holds a per-schema advisory lock, so servers that
  start together on an empty schema create one node key and one system.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterable, AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from mycelia.errors import StorageError
from mycelia.proto import AdmittedEvent, EntityId, EntityState, EventId
from mycelia.proto.query import After, Query
from mycelia.retrieval import StoredState, WriteBatch, WriteResult
from mycelia.storage.engine import (
    DumpRecord,
    FeedEntry,
    MetaRecord,
    decode_values,
    entity_records,
)
from mycelia.storage.postgres_arrays import Bytea, Texts
from mycelia.storage.postgres_fetch import QueryReader
from mycelia.storage.postgres_listen import FeedListener
from mycelia.storage.postgres_pool import configure, translate
from mycelia.storage.postgres_schema import check_schema, lock_key, migrate
from mycelia.storage.postgres_sql import (
    QUERIES,
    SCHEMA_VERSION,
    admitted,
    clock,
    decode_state,
)
from mycelia.storage.postgres_write import events_query
from mycelia.storage.postgres_writer import Writer
from mycelia.storage.recent import RecentEvents

__all__ = ["SCHEMA_VERSION", "PostgresStorage"]

_SCHEMA_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,39}\Z")


class PostgresStorage:
    """The PostgreSQL engine; ``await PostgresStorage(dsn).open()`` (see the module docstring)."""

    shared: Final = True
    """Other processes may write this store: a node on it follows its change feed
    (:mod:`mycelia.node.feed`)."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "mycelia",
        min_connections: int = 1,
        max_connections: int = 8,
        poll_interval: float = 1.0,
        connect_timeout: float = 30.0,
        listen: bool = True,
        create: bool = True,
    ) -> None:
        if not _SCHEMA_NAME.match(schema):
            raise StorageError(f"schema must match {_SCHEMA_NAME.pattern}, not {schema!r}")
        self.dsn = dsn
        self.schema = schema
        self.channel = f"mycelia_feed_{schema}"
        self._sizes = (min_connections, max_connections)
        self._poll = poll_interval
        self._listen_enabled = listen
        self._create = create
        self._connect_timeout = connect_timeout
        self._q = {k: sql.SQL(v).format(s=sql.Identifier(schema)) for k, v in QUERIES.items()}
        self._pool: AsyncConnectionPool[Any] | None = None
        self._recent = RecentEvents()
        """Events this engine wrote, read or heard of lately (:mod:`mycelia.storage.recent`):
        a walk or a client's request for the last few events of an entity costs no round
        trip."""
        self._listener = FeedListener(
            dsn,
            self.channel,
            clock=self.last_offset,
            poll_interval=poll_interval,
            remember=self._recent.remember,
        )
        self._writer = Writer(
            self._ready,
            self._q,
            channel=self.channel,
            recent=self._recent,
            listener=self._listener,
        )
        self._queries = QueryReader(self._fetch, self._ready, self._q)
        self._opening = asyncio.Lock()
        self._closed = False

    # ------------------------------------------------------------------ opening

    async def open(self) -> PostgresStorage:
        """Connect, create or migrate the schema, start listening; returns ``self``.

        Raises StorageError if the server cannot be reached or the schema is newer.
        """
        async with self._opening:
            if self._closed:
                raise StorageError("this PostgresStorage is closed")
            if self._pool is not None:
                return self
            pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                self.dsn, min_size=self._sizes[0], max_size=self._sizes[1],
                kwargs={"autocommit": True}, open=False, timeout=self._connect_timeout,
                configure=configure,
            )  # fmt: skip
            try:
                await pool.open(wait=True, timeout=self._connect_timeout)
                async with pool.connection() as conn:
                    if self._create:
                        await migrate(conn, self.schema, self._q)
                    else:
                        await check_schema(conn, self.schema)
            except (psycopg.Error, PoolTimeout) as exc:
                await pool.close()
                raise translate(exc, f"cannot open PostgreSQL schema {self.schema}") from exc
            except BaseException:
                await pool.close()
                raise
            self._pool = pool
            if self._listen_enabled:
                await self._listener.start(timeout=self._connect_timeout)
            return self

    async def _ready(self) -> AsyncConnectionPool[Any]:
        if self._closed:
            raise StorageError("this PostgreSQL storage is closed")
        if self._pool is None:
            await self.open()
        assert self._pool is not None
        return self._pool

    async def _fetch(
        self, name: str, params: Sequence[Any] | Mapping[str, Any]
    ) -> list[tuple[Any, ...]]:
        pool = await self._ready()
        try:
            async with pool.connection() as conn:
                cursor = await conn.execute(self._q[name], params, binary=True)
                rows: list[tuple[Any, ...]] = await cursor.fetchall()
                return rows
        except (psycopg.Error, PoolTimeout) as exc:
            raise translate(exc, f"PostgreSQL read ({name}) failed") from exc

    # ------------------------------------------------------------------ reads

    async def get_events(
        self, ids: Collection[EventId], *, ahead: int = 0
    ) -> Mapping[EventId, AdmittedEvent]:
        """Known events among ``ids`` plus up to ``ahead`` ancestors (one recursive query
        for those not among the recent events this engine holds)."""
        found, rest = self._recent.read(ids, ahead)
        if not rest:
            return found
        rows = await self._fetch(*events_query(rest, ahead))
        read = [admitted(row) for row in rows]
        self._recent.remember(read)
        found.update((e.id, e) for e in read)
        return found

    async def event_stored(self, event_id: EventId) -> bool:
        """Whether the event is stored."""
        if event_id in self._recent:
            return True
        return bool(await self._fetch("stored", (bytes(event_id),)))

    async def events_of(self, entity_id: EntityId) -> list[AdmittedEvent]:
        """The entity's events, parents first (generation, then id)."""
        return [admitted(r) for r in await self._fetch("events_of", (bytes(entity_id),))]

    async def get_state(self, entity_id: EntityId) -> EntityState | None:
        """The stored state, or None."""
        rows = await self._fetch("state", (bytes(entity_id),))
        return decode_state(rows[0][0]) if rows else None

    async def get_states(self, ids: Collection[EntityId]) -> dict[EntityId, EntityState]:
        """The stored states among ``ids``."""
        if not ids:
            return {}
        rows = await self._fetch("states", (Bytea([bytes(i) for i in ids]),))
        states = [decode_state(r[0]) for r in rows]
        return {s.entity_id: s for s in states}

    async def scan(self, collection: str) -> list[StoredState]:
        """Every state of ``collection``, in entity id order."""
        rows = await self._fetch("scan", (collection,))
        return [StoredState(decode_state(st), decode_values(raw)) for st, raw in rows]

    async def fetch(
        self, collection: str, query: Query, *, after: After | None = None
    ) -> list[StoredState]:
        """The states of ``collection`` matching the bound ``query``, in its order, at most
        its limit: exactly ``sort_rows`` over :meth:`scan` (after the position ``after``),
        with an indexable conjunct's range pushed down to ``field_keys`` (see the module
        docstring and :mod:`mycelia.storage.postgres_fetch`).

        Raises InvalidArgument if the query has placeholders.
        """
        return await self._queries.fetch(collection, query, after=after)

    async def read_since(self, offset: int, *, limit: int = 1000) -> list[FeedEntry]:
        """Feed rows after ``offset``, ascending, at most ``limit`` (never skipping one)."""
        if limit <= 0:
            return []
        known = self._known_since(offset, limit, lambda _: True)
        if known:
            return known  # rows never change once committed: these are the stored ones
        rows = await self._fetch("feed", (offset, limit))
        return [FeedEntry(o, EntityId._trusted(e), c, clock(h)) for o, e, c, h in rows]

    async def read_feed(
        self, offset: int, *, limit: int = 1000, collections: Collection[str] | None = None
    ) -> list[FeedEntry]:
        """:meth:`read_since`, reading the stored events the rows' heads name in the same
        query, into the recent events :meth:`get_events` answers from: a follower reads
        those next, and another process's commit then costs it one query, not two.
        ``collections``: read the events of those collections' rows only (``None``: all;
        a follower names the collections it shows, and skips the other rows). A run of
        rows this engine wrote, or heard of and either of no such collection or with the
        events their heads name heard too, costs no query: a server reads nothing for a
        commit whose notification said it whole."""
        if limit <= 0:
            return []
        recent = self._recent

        def known(row: FeedEntry) -> bool:
            if collections is not None and row.collection not in collections:
                return True
            return all(i in recent for i in row.head)

        known_rows = self._known_since(offset, limit, known)
        if known_rows:
            return known_rows  # their events are recent ones (written or heard), or unread
        entries: list[FeedEntry] = []
        events: list[AdmittedEvent] = []
        shown = None if collections is None else Texts(sorted(collections))
        params = (offset, limit, shown, shown)
        for o, e, c, h, *event in await self._fetch("feed_heads", params):
            if o is not None:  # the rows, in feed order, then the events their heads name
                entries.append(FeedEntry(o, EntityId._trusted(e), c, clock(h)))
            else:
                events.append(admitted(event))
        self._recent.remember(events)
        return entries

    def _known_since(
        self, offset: int, limit: int, usable: Callable[[FeedEntry], bool]
    ) -> list[FeedEntry]:
        """The run of ``usable`` rows right after ``offset`` (at most ``limit``) known
        without a query: this engine's own and those notifications told of."""
        known: list[FeedEntry] = []
        heard = self._listener.heard
        while len(known) < limit:
            row = heard.get(offset + 1 + len(known))
            if row is None or not usable(row):
                break
            known.append(row)
        return known

    async def last_offset(self) -> int:
        """The newest committed offset."""
        rows = await self._fetch("last", ())
        return int(rows[0][0])

    async def get_meta(self, key: str) -> bytes | None:
        """A node-level record."""
        rows = await self._fetch("meta", (key,))
        return bytes(rows[0][0]) if rows else None

    async def scan_meta(self, prefix: str) -> list[tuple[str, bytes]]:
        """The node-level records under ``prefix``, in key order."""
        rows = await self._fetch("scan_meta", {"prefix": prefix})
        return [(key, bytes(value)) for key, value in rows]

    async def wait_for_feed(self, offset: int, *, timeout: float) -> bool:
        """Wait for a feed row beyond ``offset`` (NOTIFY wakes it early; polls otherwise)."""
        await self._ready()
        return await self._listener.wait(offset, timeout=timeout)

    # ------------------------------------------------------------------ several processes

    @property
    def listener_pid(self) -> int | None:
        """The PostgreSQL backend pid of the feed's ``LISTEN`` connection (``None`` while
        it is not listening), as ``pg_stat_activity`` shows it."""
        return self._listener.pid

    async def node_key(self, name: str, candidate: bytes) -> bytes:
        """The node key kept in this schema for the node called ``name``, storing
        ``candidate`` first if there is none (atomic: processes starting together with
        one name get one key). Raises StorageError."""
        pool = await self._ready()
        try:
            async with pool.connection() as conn, conn.transaction():
                await conn.execute(self._q["node_key_put"], (name, candidate))
                row = await (await conn.execute(self._q["node_key"], (name,))).fetchone()
        except (psycopg.Error, PoolTimeout) as exc:
            raise translate(exc, "PostgreSQL node key read failed") from exc
        assert row is not None
        return bytes(row[0])

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Hold this schema's start-up lock (a session advisory lock): one process at a
        time, so servers starting together create one node key and one system."""
        pool = await self._ready()
        key = lock_key(f"mycelia:{self.schema}:start")
        try:
            async with pool.connection() as conn:
                await conn.execute("SELECT pg_advisory_lock(%s)", (key,))
                try:
                    yield
                finally:
                    await conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
        except (psycopg.Error, PoolTimeout) as exc:
            raise translate(exc, "PostgreSQL start-up lock failed") from exc

    # ------------------------------------------------------------------ dump and load

    async def dump(self) -> AsyncIterator[DumpRecord]:
        """Meta records, then every entity in id order (keyset-paginated reads)."""
        for key, value in await self._fetch("all_meta", ()):
            yield MetaRecord(key, bytes(value))
        after = b""
        while rows := await self._fetch("entities", {"after": after, "n": 256}):
            for (raw_id,) in rows:
                entity_id = EntityId._trusted(raw_id)
                events = await self.events_of(entity_id)
                found = await self._fetch("stored_state", (bytes(entity_id),))
                state = None
                if found:
                    state = StoredState(decode_state(found[0][0]), decode_values(found[0][1]))
                for record in entity_records(entity_id, events, state):
                    yield record
            after = bytes(rows[-1][0])

    async def load(
        self, records: AsyncIterable[DumpRecord], *, if_offset: int | None = None
    ) -> int:
        """Write a dump stream all or nothing; returns how many events it held
        (:meth:`Writer.load <mycelia.storage.postgres_writer.Writer.load>`)."""
        return await self._writer.load(records, if_offset=if_offset)

    # ------------------------------------------------------------------ writes

    async def write(self, batch: WriteBatch) -> WriteResult:
        """Make ``batch`` durable in one transaction; raises StorageError, writing nothing
        (:meth:`Writer.write <mycelia.storage.postgres_writer.Writer.write>`)."""
        return await self._writer.write(batch)

    # ------------------------------------------------------------------ closing

    async def close(self) -> None:
        """Stop listening and close the pool; further use raises StorageError."""
        self._closed = True
        await self._writer.close()
        await self._listener.close()
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
