"""``LmdbStorage``: the embedded durable engine (ARCHITECTURE.md §6).

The layout and opening are in :mod:`.lmdb_format`, the writer thread (one writer, group
commit, the feed counter, map growth) in :mod:`.lmdb_writer`, the field index and
``fetch`` in :mod:`.lmdb_index`. This module holds the engine and its reads.

Invariants:

- **Reads** run in short read transactions on the caller's thread (a point read is a few
  microseconds, cheaper than a thread hop); the large ones (a long history, a collection
  scan, a fetch reading more than ``LARGE_READ`` candidate rows) run in a worker thread.
  Read-ahead happens inside one read transaction, and so does each fetch.
- A read sees every write acknowledged before it began: the event loop's thread keeps one
  read transaction and renews it when the writer's commit count has moved.
- **Exclusive.** One engine per store, across processes (``flock``, see
  :mod:`.lmdb_format`); opening replays nothing: it reads the format version and the last
  feed offset, so it costs the same at any size (but for the one-time migration of a
  layout 1 store, which builds the field index).
- ``fetch`` returns exactly what ``sort_rows`` over ``scan`` returns (same rows, same
  order, LIMIT applied), through the field index when the query has an indexable conjunct.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Callable,
    Collection,
    Iterator,
    Mapping,
)
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypeVar

import lmdb

from mycelia.errors import StorageCorrupt, StorageError, StorageReadOnly
from mycelia.proto import AdmittedEvent, EntityId, EntityState, EventId
from mycelia.proto.query import After, Query
from mycelia.retrieval import StoredState, WriteBatch, WriteResult
from mycelia.retrieval.readahead import events_with_ancestors
from mycelia.storage.engine import (
    DumpRecord,
    EntityRecord,
    FeedEntry,
    FeedSignal,
    MetaRecord,
    decode_feed,
    entity_records,
)
from mycelia.storage.lmdb_format import (
    FORMAT_VERSION,
    Gate,
    admitted,
    last_feed_offset,
    open_databases,
    open_env,
    stored,
    stored_state,
    take_lock,
    translate,
)
from mycelia.storage.lmdb_index import OverBudget, build_index, fetch_in
from mycelia.storage.lmdb_writer import (
    Encoded,
    Staged,
    Writer,
    encode_batch,
    pack_encoded,
    unpack_encoded,
)
from mycelia.storage.plan import check_bound, matches_nothing, plan_query
from mycelia.storage.recent import RecentEvents
from mycelia.storage.staging import Spill, load_batches

__all__ = ["DEFAULT_MAP_SIZE", "FORMAT_VERSION", "LARGE_READ", "LmdbStorage"]

if TYPE_CHECKING:
    Txn = lmdb.Transaction[bytes]

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_MAP_SIZE: Final = 1 << 30
"""Initial map size (address space, not disk: the file grows as data does)."""
STALE_SNAPSHOT: Final = 64
"""Commits after which a writing thread drops its cached read snapshot."""
LARGE_READ: Final = 2000
"""Reads decoding more records than this move to a worker thread."""


class LmdbStorage:
    """The LMDB engine. ``LmdbStorage(path)`` opens (or creates) the store at ``path``.

    Opening is synchronous and cheap. Raises StorageLocked if another engine (in any
    process) has the store open, StorageReadOnly if it cannot be created or written,
    StorageCorrupt if it is not a Mycelia LMDB store of this format.
    """

    local_reads: Final = True
    """A read costs no round trip (the loop's thread keeps its read transaction): a walk
    here asks for an eighth of its read-ahead (:func:`~mycelia.retrieval.reads_ahead`); a
    peer's request for events gets all of it."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        map_size: int = DEFAULT_MAP_SIZE,
        durable: bool = True,
        readonly: bool = False,
        max_readers: int = 126,
    ) -> None:
        self.path = Path(path)
        self.durable = durable
        self.readonly = readonly
        self._gate = Gate()
        self._closed = False
        self._owner: int | None = None
        self._recent = RecentEvents()
        """Events this engine committed lately (:mod:`mycelia.storage.recent`)."""
        self._cached: Txn | None = None
        self._cached_at = -1
        self._lock_fd = take_lock(self.path, readonly=readonly)
        try:
            self._env = open_env(
                self.path, map_size=map_size, max_readers=max_readers, readonly=readonly,
                durable=durable,
            )  # fmt: skip
            self._dbs = open_databases(self._env, self.path, readonly=readonly, migrate=build_index)
            last = last_feed_offset(self._env, self._dbs)
        except BaseException:
            self._unlock()
            raise
        self._news = FeedSignal()
        self._writer = Writer(
            self._env, self._dbs, gate=self._gate, news=self._news, path=self.path,
            last_offset=last,
        )  # fmt: skip
        if not readonly:
            self._writer.start()

    # ------------------------------------------------------------------ reads

    def _read(self, fn: Callable[[Txn], T]) -> T:
        """Run ``fn`` in a read transaction that sees every acknowledged commit.

        The thread that reads first (the event loop's, normally) keeps its transaction
        between calls and renews it only after a commit: beginning one releases the GIL,
        which costs a GIL round trip whenever the writer thread is busy. Other threads
        (large reads) use a transaction of their own. lmdb errors become StorageError.
        """
        if self._closed:
            raise StorageError(f"this LmdbStorage ({self.path}) is closed")
        with self._gate.shared():
            if self._owner is None:
                self._owner = threading.get_ident()
            owner = self._owner == threading.get_ident()
            try:
                if owner:
                    return fn(self._snapshot())
                txn: Txn = self._env.begin()
                with txn:
                    return fn(txn)
            except lmdb.Error as exc:
                if owner:
                    self._drop_snapshot()  # a failed transaction is not reused
                raise translate(exc, "read failed") from exc

    def _drop_snapshot(self) -> None:
        if self._cached is not None:
            self._cached.abort()
            self._cached = None

    def _snapshot(self) -> Txn:
        # Read before begin(): the transaction sees at least these commits.
        commits = self._writer.commits
        if self._cached is None or self._cached_at != commits:
            self._drop_snapshot()
            self._cached = self._env.begin()
            self._cached_at = commits
        return self._cached

    async def _read_large(self, fn: Callable[[Txn], T], size: int) -> T:
        if size <= LARGE_READ:
            return self._read(fn)
        return await asyncio.to_thread(self._read, fn)

    def _get_event(self, txn: Txn, event_id: EventId) -> AdmittedEvent | None:
        recent = self._recent.get(event_id)
        if recent is not None:
            return recent
        value = txn.get(event_id, db=self._dbs[b"events"])
        return None if value is None else admitted(event_id, value)

    async def get_events(
        self, ids: Collection[EventId], *, ahead: int = 0
    ) -> Mapping[EventId, AdmittedEvent]:
        """Known events among ``ids`` plus up to ``ahead`` ancestors, in one read txn."""
        return await self._read_large(
            lambda txn: events_with_ancestors(lambda i: self._get_event(txn, i), ids, ahead),
            len(ids) + ahead,
        )

    async def event_stored(self, event_id: EventId) -> bool:
        """Whether the event is stored."""
        if event_id in self._recent:
            return True
        return self._read(lambda txn: txn.get(event_id, db=self._dbs[b"events"]) is not None)

    def _entity_keys(self, txn: Txn, entity_id: EntityId) -> list[bytes]:
        cursor = txn.cursor(db=self._dbs[b"by_entity"])
        keys = []
        if cursor.set_range(entity_id):
            for key in cursor.iternext(keys=True, values=False):
                if key[:32] != entity_id:
                    break
                keys.append(key[40:])
        return keys

    async def events_of(self, entity_id: EntityId) -> list[AdmittedEvent]:
        """The entity's events, parents first (index order: generation, then id)."""
        keys = self._read(lambda txn: self._entity_keys(txn, entity_id))
        found = await self._read_large(
            lambda txn: [self._get_event(txn, EventId._trusted(k)) for k in keys], len(keys)
        )
        if any(e is None for e in found):
            raise StorageCorrupt(f"the index of entity {entity_id} names a missing event")
        return [e for e in found if e is not None]

    async def get_state(self, entity_id: EntityId) -> EntityState | None:
        """The stored state, or None."""

        def read(txn: Txn) -> EntityState | None:
            value = txn.get(entity_id, db=self._dbs[b"states"])
            return None if value is None else stored_state(value, txn, self._dbs)

        return self._read(read)

    async def get_states(self, ids: Collection[EntityId]) -> dict[EntityId, EntityState]:
        """The stored states among ``ids``."""

        def read(txn: Txn) -> dict[EntityId, EntityState]:
            db = self._dbs[b"states"]
            found = ((i, txn.get(i, db=db)) for i in ids)
            return {i: stored_state(v, txn, self._dbs) for i, v in found if v is not None}

        return await self._read_large(read, len(ids))

    async def scan(self, collection: str) -> list[StoredState]:
        """Every state of ``collection`` (through the collection index)."""
        prefix = collection.encode() + b"\0"

        def keys(txn: Txn) -> list[bytes]:
            cursor = txn.cursor(db=self._dbs[b"by_collection"])
            found = []
            if cursor.set_range(prefix):
                for key in cursor.iternext(keys=True, values=False):
                    if not key.startswith(prefix):
                        break
                    found.append(key[len(prefix) :])
            return found

        ids = self._read(keys)

        def read(txn: Txn) -> list[StoredState]:
            db = self._dbs[b"states"]
            found = (txn.get(i, db=db) for i in ids)
            return [stored(v, txn, self._dbs) for v in found if v is not None]

        return await self._read_large(read, len(ids))

    async def fetch(
        self, collection: str, query: Query, *, after: After | None = None
    ) -> list[StoredState]:
        """The states of ``collection`` matching the bound ``query``, in its order, at most
        its limit: exactly ``sort_rows`` over :meth:`scan` (after the position ``after``),
        read through the field index when the query has an indexable conjunct (see
        :mod:`mycelia.storage.plan`).

        Raises InvalidArgument if the query has placeholders.
        """
        check_bound(query)
        plan = plan_query(query)
        if matches_nothing(query, plan):
            return []

        def run(budget: int | None) -> Callable[[Txn], list[StoredState]]:
            return lambda txn: fetch_in(
                txn, self._dbs, collection, query, plan=plan, budget=budget, after=after
            )

        try:
            return self._read(run(LARGE_READ))
        except OverBudget:  # many candidates: decode them off the event loop
            return await asyncio.to_thread(self._read, run(None))

    async def read_since(self, offset: int, *, limit: int = 1000) -> list[FeedEntry]:
        """Feed rows after ``offset``, ascending, at most ``limit``."""

        def read(txn: Txn) -> list[FeedEntry]:
            cursor = txn.cursor(db=self._dbs[b"feed"])
            rows: list[FeedEntry] = []
            if limit <= 0 or not cursor.set_range((max(offset, 0) + 1).to_bytes(8, "big")):
                return rows
            for key, value in cursor:
                rows.append(decode_feed(int.from_bytes(key, "big"), value))
                if len(rows) >= limit:
                    break
            return rows

        return await self._read_large(read, limit)

    async def last_offset(self) -> int:
        """The newest committed offset."""
        return self._writer.last_offset

    async def get_meta(self, key: str) -> bytes | None:
        """A node-level record."""
        return self._read(lambda txn: txn.get(key.encode(), db=self._dbs[b"meta"]))

    async def scan_meta(self, prefix: str) -> list[tuple[str, bytes]]:
        """The node-level records under ``prefix``, in key order."""
        start = prefix.encode()

        def read(txn: Txn) -> list[tuple[str, bytes]]:
            cursor = txn.cursor(db=self._dbs[b"meta"])
            found = []
            if cursor.set_range(start):
                for key, value in cursor:
                    if not key.startswith(start):
                        break
                    found.append((key.decode(), value))
            return found

        return self._read(read)

    async def wait_for_feed(self, offset: int, *, timeout: float) -> bool:
        """Wait until a commit takes the feed beyond ``offset`` (or ``timeout`` passes)."""
        return await self._news.wait(lambda: self._writer.last_offset > offset, timeout)

    # ------------------------------------------------------------------ dump and load

    def _next_entities(self, txn: Txn, after: bytes | None, n: int) -> list[EntityId]:
        """The first ``n`` entity ids above ``after`` that have events or a state."""
        found: set[bytes] = set()
        cursor = txn.cursor(db=self._dbs[b"by_entity"])
        positioned = cursor.first() if after is None else cursor.set_range(after + b"\xff" * 41)
        while positioned and len(found) < n:
            entity = cursor.key()[:32]
            found.add(entity)
            positioned = cursor.set_range(entity + b"\xff" * 41)
        cursor = txn.cursor(db=self._dbs[b"states"])
        positioned = cursor.first() if after is None else cursor.set_range(after + b"\0")
        for count, key in enumerate(cursor.iternext(keys=True, values=False) if positioned else ()):
            if count >= n:
                break
            found.add(key)
        return [EntityId._trusted(k) for k in sorted(found)[:n]]

    async def dump(self) -> AsyncIterator[DumpRecord]:
        """Meta records, then every entity in id order, read in short transactions."""
        meta = self._read(lambda txn: list(txn.cursor(db=self._dbs[b"meta"])))
        for key, value in meta:
            yield MetaRecord(key.decode(), value)
        after: bytes | None = None
        while ids := self._read(lambda txn: self._next_entities(txn, after, 256)):  # noqa: B023 - called at once
            for entity_id in ids:
                for record in await self._entity_records(entity_id):
                    yield record
            after = ids[-1]

    async def _entity_records(self, entity_id: EntityId) -> list[EntityRecord]:
        events = await self.events_of(entity_id)

        def read(txn: Txn) -> StoredState | None:
            raw = txn.get(entity_id, db=self._dbs[b"states"])
            return None if raw is None else stored(raw, txn, self._dbs)

        return entity_records(entity_id, events, self._read(read))

    async def load(
        self, records: AsyncIterable[DumpRecord], *, if_offset: int | None = None
    ) -> int:
        """Write a dump stream all or nothing; returns how many events it held.

        The encoded batches are staged in an unlinked file in the store's directory, then
        committed by the writer in one transaction (see :mod:`.lmdb_writer`).
        """
        self._check_writable()
        total = 0
        with Spill(self.path) as spill:
            async for batch in load_batches(records):
                total += len(batch.events)
                await asyncio.to_thread(spill.append, pack_encoded(encode_batch(batch)))

            def batches() -> Iterator[Encoded]:  # re-read from the start on each call
                return map(unpack_encoded, spill.items())

            await self._writer.submit(Staged(batches, if_offset))
        return total

    # ------------------------------------------------------------------ writes

    async def write(self, batch: WriteBatch) -> WriteResult:
        """Make ``batch`` durable atomically (group-committed with concurrent writes).

        Raises StorageError (StorageReadOnly on a read-only store) and writes nothing on
        failure. A cancelled caller does not retract its batch: it may still commit.
        """
        self._check_writable()
        encoded = encode_batch(batch)
        if not encoded:
            return WriteResult(frozenset(), ())
        if batch.forget:
            self._recent.forget_entities(frozenset(batch.forget))
        result = await self._writer.submit(encoded)
        self._remember(batch.events)
        return result

    @property
    def cached_event_bytes(self) -> int:
        """Bytes of recently committed events kept decoded (at most RECENT_BYTES)."""
        return self._recent.bytes

    def _check_writable(self) -> None:
        if self._closed:
            raise StorageError(f"this LmdbStorage ({self.path}) is closed")
        if self.readonly:
            raise StorageReadOnly(f"{self.path} was opened read-only")

    def _remember(self, events: tuple[AdmittedEvent, ...]) -> None:
        """Keep just-committed events at hand; let go of a read snapshot grown old."""
        self._recent.remember(events)
        # A snapshot pins the pages it sees: renewing only on reads could pin old ones
        # through a long run of writes, so the file would grow instead of reusing them.
        age = self._writer.commits - self._cached_at
        stale = self._cached is not None and age > STALE_SNAPSHOT
        if stale and self._owner == threading.get_ident():
            with self._gate.shared():
                self._drop_snapshot()

    # ------------------------------------------------------------------ closing

    async def close(self) -> None:
        """Finish queued writes, stop the writer, close the environment, drop the lock."""
        if self._closed:
            return
        self._closed = True
        await self._writer.stop()
        with self._gate.exclusive():
            self._drop_snapshot()
            self._env.close()
        self._unlock()

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
