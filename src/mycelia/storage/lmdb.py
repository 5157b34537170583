"""``LmdbStorage``: the embedded durable engine (ARCHITECTURE.md §6).

Layout — named databases, opened once when the engine is constructed:

==================  ===========================================  ============================
database            key                                          value
==================  ===========================================  ============================
``events``          event id                                     generation (8 bytes BE) +
                                                                 canonical event bytes
``by_entity``       entity id + generation (8 BE) + event id     empty (parents-first index)
``states``          entity id                                    len (4 BE) + state bytes +
                                                                 values (msgpack)
``by_collection``   collection (UTF-8) + NUL + entity id         empty (``scan`` index)
``feed``            offset (8 BE)                                :func:`encode_feed` row
``meta``            key (UTF-8)                                  value
``engine``          ``format``                                   format version
==================  ===========================================  ============================

Invariants:

- **One writer.** Every write transaction runs on one dedicated thread. ``write()`` encodes
  the batch on the caller's thread (a batch that cannot be encoded fails alone, before
  anything is queued), queues it, and awaits a future the writer resolves only after the
  transaction holding it has committed — with ``durable=True`` (the default) that commit
  includes the fsync, so an acknowledged write survives a crash.
- **Group commit.** The writer takes every batch queued while it was busy and commits them
  in one transaction and one fsync, so concurrent committers share the cost of a sync. If
  a group fails, its batches are retried one transaction each: a bad batch fails alone,
  and each batch stays atomic (all of it or nothing).
- **Feed.** The writer owns the offset counter: offsets are assigned in commit order, one
  per state, strictly increasing and without gaps; a failed transaction assigns none.
- **Map size** grows on demand: a transaction that hits ``MapFullError`` is aborted, the map
  is doubled (while no read transaction is open: reads pass a shared gate that the resize
  takes exclusively) and the transaction is retried.
- **Reads** run in short read transactions on the caller's thread (a point read is a few
  microseconds, cheaper than a thread hop); the large ones (a long history, a collection
  scan) decode in a worker thread. Read-ahead happens inside one read transaction.
- **Exclusive.** A process holds ``mycelia.lock`` (``flock``) while the store is open, so a
  second opener gets :class:`~mycelia.errors.StorageLocked` at once; the lock dies with the
  process, so a crash needs no cleanup. Opening replays nothing: it reads the format
  version and the last feed offset, so it costs the same at any size.
- Stored events are re-hashed on read; content that does not match its key, or does not
  decode, raises :class:`~mycelia.errors.StorageCorrupt`.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import os
import queue
import threading
from collections import OrderedDict
from collections.abc import AsyncIterable, AsyncIterator, Callable, Collection, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypeVar

import lmdb

from mycelia.errors import DecodeError, StorageCorrupt, StorageError, StorageLocked, StorageReadOnly
from mycelia.proto import AdmittedEvent, EntityId, EntityState, Event, EventId
from mycelia.retrieval import StoredState, WriteBatch, WriteResult
from mycelia.retrieval.readahead import events_with_ancestors
from mycelia.storage.engine import (
    STORED_LIMITS,
    DumpRecord,
    EntityRecord,
    FeedEntry,
    FeedSignal,
    MetaRecord,
    decode_feed,
    decode_values,
    encode_feed,
    encode_values,
    entity_records,
    load_records,
)

__all__ = ["DEFAULT_MAP_SIZE", "FORMAT_VERSION", "LmdbStorage"]

if TYPE_CHECKING:
    Txn = lmdb.Transaction[bytes]

log = logging.getLogger(__name__)
T = TypeVar("T")

FORMAT_VERSION: Final = b"1"
"""The on-disk layout version, written once and checked on every open."""
DEFAULT_MAP_SIZE: Final = 1 << 30
"""Initial map size (address space, not disk: the file grows as data does)."""
MAX_GROUP: Final = 512
"""Most batches one group-commit transaction takes."""
RECENT_EVENTS: Final = 4096
"""How many recently committed events are kept decoded for reads."""
STALE_SNAPSHOT: Final = 64
"""Commits after which a writing thread drops its cached read snapshot."""
LARGE_READ: Final = 2000
"""Reads decoding more records than this move to a worker thread."""
_NAMES: Final = (b"events", b"by_entity", b"states", b"by_collection", b"feed", b"meta", b"engine")
_STOP: Final = None


class _Gate:
    """Shared for reads, exclusive for a map resize or close (a readers-writer lock)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._exclusive = False

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive)
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive)
            self._exclusive = True
            self._cond.wait_for(lambda: not self._readers)
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


@dataclass(frozen=True, slots=True)
class _Encoded:
    """A write batch as the writer puts it: keys and values, ready to write."""

    events: tuple[tuple[EventId, bytes, bytes], ...]  # id, by_entity key, value
    states: tuple[tuple[bytes, bytes, bytes, bytes], ...]  # key, value, collection key, feed
    meta: tuple[tuple[bytes, bytes | None], ...]


@dataclass(slots=True)
class _Request:
    batch: _Encoded
    future: asyncio.Future[WriteResult]
    loop: asyncio.AbstractEventLoop


def _encode(batch: WriteBatch) -> _Encoded:
    """Encode a batch; raises StorageError (nothing queued) if any part cannot be stored."""
    events = tuple(
        (
            e.id,
            e.entity_id + e.generation.to_bytes(8, "big") + e.id,
            e.generation.to_bytes(8, "big") + e.event.to_bytes(),
        )
        for e in batch.events
    )
    states = []
    for stored in batch.states:
        state = stored.state
        if not isinstance(state, EntityState):
            raise StorageError("a write batch holds something that is not a state")
        raw = state.to_bytes()
        value = len(raw).to_bytes(4, "big") + raw + encode_values(stored.values)
        key = state.collection.encode() + b"\0" + state.entity_id
        feed = encode_feed(state.entity_id, state.collection, state.state.head)
        states.append((bytes(state.entity_id), value, key, feed))
    meta = tuple((k.encode(), v) for k, v in batch.meta)
    return _Encoded(events, tuple(states), meta)


def _translate(exc: BaseException, what: str) -> StorageError:
    """The typed error for an lmdb (or OS) failure."""
    if isinstance(exc, StorageError):
        return exc
    if isinstance(exc, (lmdb.InvalidError, lmdb.CorruptedError, lmdb.VersionMismatchError)):
        return StorageCorrupt(f"{what}: the store is damaged or not an LMDB store: {exc}")
    if isinstance(exc, lmdb.ReadonlyError) or (
        isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EROFS, errno.EPERM)
    ):
        return StorageReadOnly(f"{what}: the store cannot be written: {exc}")
    if isinstance(exc, lmdb.LockError):
        return StorageLocked(f"{what}: {exc}")
    return StorageError(f"{what}: {exc}")


def _admitted(event_id: bytes, value: bytes) -> AdmittedEvent:
    """Decode an ``events`` value, checking that its content hashes to its key."""
    try:
        event = Event.from_bytes(
            value[8:], limits=STORED_LIMITS, expect_id=EventId._trusted(event_id)
        )
    except DecodeError as exc:
        raise StorageCorrupt(f"stored event {event_id.hex()} is damaged: {exc}") from exc
    return AdmittedEvent(event, int.from_bytes(value[:8], "big"))


def _state(value: bytes) -> EntityState:
    """Decode the state of a ``states`` value (length-prefixed, then the values)."""
    try:
        return EntityState.from_bytes(
            value[4 : 4 + int.from_bytes(value[:4])], limits=STORED_LIMITS
        )
    except DecodeError as exc:
        raise StorageCorrupt(f"a stored state is damaged: {exc}") from exc


def _stored(value: bytes) -> StoredState:
    return StoredState(_state(value), decode_values(value[4 + int.from_bytes(value[:4]) :]))


class LmdbStorage:
    """The LMDB engine. ``LmdbStorage(path)`` opens (or creates) the store at ``path``.

    Opening is synchronous and cheap. Raises StorageLocked if another engine (in any
    process) has the store open, StorageReadOnly if it cannot be created or written,
    StorageCorrupt if it is not a Mycelia LMDB store of this format.
    """

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
        self._gate = _Gate()
        self._queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._news = FeedSignal()
        self._closed = False
        self._commits = 0
        """Committed write transactions; the writer bumps it before releasing callers."""
        self._owner: int | None = None
        self._recent: OrderedDict[EventId, AdmittedEvent] = OrderedDict()
        """Events this engine committed lately (immutable, so never stale): a commit reads
        its parents, which are usually the events of the commit before."""
        self._cached: Txn | None = None
        self._cached_at = -1
        self._lock_fd = self._take_lock()
        try:
            self._env = self._open_env(map_size, max_readers)
            self._dbs = self._open_dbs()
            txn: Txn = self._env.begin()
            with txn:
                self._last_offset = self._last_feed_offset(txn)
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._writer: threading.Thread | None = None
        if not readonly:
            self._writer = threading.Thread(
                target=self._writer_loop, name=f"mycelia-lmdb-writer:{self.path}", daemon=True
            )
            self._writer.start()

    # ------------------------------------------------------------------ opening

    def _take_lock(self) -> int:
        try:
            if not self.readonly:
                self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(
                self.path / "mycelia.lock",
                os.O_RDONLY if self.readonly else os.O_RDWR | os.O_CREAT,
                0o644,
            )
        except OSError as exc:
            raise _translate(exc, f"cannot open {self.path}") from exc
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if self.readonly else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise StorageLocked(
                f"{self.path} is open in another engine (maybe another process)"
            ) from exc
        return fd

    def _open_env(self, map_size: int, max_readers: int) -> lmdb.Environment:
        try:
            return lmdb.open(
                str(self.path), map_size=map_size, max_dbs=len(_NAMES), readonly=self.readonly,
                sync=self.durable, metasync=self.durable, readahead=False,
                max_readers=max_readers, create=not self.readonly,
            )  # fmt: skip
        except (lmdb.Error, OSError) as exc:
            raise _translate(exc, f"cannot open {self.path}") from exc

    def _open_dbs(self) -> dict[bytes, lmdb._Database]:
        try:
            dbs = {name: self._env.open_db(name, create=not self.readonly) for name in _NAMES}
            with self._env.begin(write=not self.readonly) as txn:
                found = txn.get(b"format", db=dbs[b"engine"])
                if found is None and not self.readonly:
                    txn.put(b"format", FORMAT_VERSION, db=dbs[b"engine"])
                    found = FORMAT_VERSION
        except (lmdb.Error, OSError) as exc:
            self._env.close()
            raise _translate(exc, f"cannot open the databases in {self.path}") from exc
        if found != FORMAT_VERSION:
            self._env.close()
            raise StorageCorrupt(
                f"{self.path} has layout version {found!r}, not {FORMAT_VERSION!r}"
            )
        return dbs

    def _last_feed_offset(self, txn: Txn) -> int:
        cursor = txn.cursor(db=self._dbs[b"feed"])
        return int.from_bytes(cursor.key(), "big") if cursor.last() else 0

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
                raise _translate(exc, "read failed") from exc

    def _drop_snapshot(self) -> None:
        if self._cached is not None:
            self._cached.abort()
            self._cached = None

    def _snapshot(self) -> Txn:
        commits = self._commits  # read before begin(): the txn sees at least these commits
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
        return None if value is None else _admitted(event_id, value)

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
        value = self._read(lambda txn: txn.get(entity_id, db=self._dbs[b"states"]))
        return None if value is None else _state(value)

    async def get_states(self, ids: Collection[EntityId]) -> dict[EntityId, EntityState]:
        """The stored states among ``ids``."""

        def read(txn: Txn) -> dict[EntityId, EntityState]:
            db = self._dbs[b"states"]
            found = ((i, txn.get(i, db=db)) for i in ids)
            return {i: _state(v) for i, v in found if v is not None}

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
            return [_stored(v) for v in (txn.get(i, db=db) for i in ids) if v is not None]

        return await self._read_large(read, len(ids))

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
        return self._last_offset

    async def get_meta(self, key: str) -> bytes | None:
        """A node-level record."""
        return self._read(lambda txn: txn.get(key.encode(), db=self._dbs[b"meta"]))

    async def wait_for_feed(self, offset: int, *, timeout: float) -> bool:
        """Wait until a commit takes the feed beyond ``offset`` (or ``timeout`` passes)."""
        return await self._news.wait(lambda: self._last_offset > offset, timeout)

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
        raw = self._read(lambda txn: txn.get(entity_id, db=self._dbs[b"states"]))
        return entity_records(entity_id, events, None if raw is None else _stored(raw))

    async def load(self, records: AsyncIterable[DumpRecord]) -> int:
        """Write a dump stream; returns how many events it held."""
        return await load_records(self, records)

    # ------------------------------------------------------------------ writes

    async def write(self, batch: WriteBatch) -> WriteResult:
        """Make ``batch`` durable atomically (group-committed with concurrent writes).

        Raises StorageError (StorageReadOnly on a read-only store) and writes nothing on
        failure. A cancelled caller does not retract its batch: it may still commit.
        """
        if self._closed:
            raise StorageError(f"this LmdbStorage ({self.path}) is closed")
        if self._writer is None:
            raise StorageReadOnly(f"{self.path} was opened read-only")
        encoded = _encode(batch)
        if not (encoded.events or encoded.states or encoded.meta):
            return WriteResult(frozenset(), ())
        loop = asyncio.get_running_loop()
        future: asyncio.Future[WriteResult] = loop.create_future()
        self._queue.put(_Request(encoded, future, loop))
        result = await future
        self._remember(batch.events)
        return result

    def _remember(self, events: tuple[AdmittedEvent, ...]) -> None:
        """Keep just-committed events at hand; let go of a read snapshot grown old."""
        recent = self._recent
        for event in events:
            recent[event.id] = event
        while len(recent) > RECENT_EVENTS:
            recent.popitem(last=False)
        # A snapshot pins the pages it sees: renewing only on reads could pin old ones
        # through a long run of writes, so the file would grow instead of reusing them.
        stale = self._cached is not None and self._commits - self._cached_at > STALE_SNAPSHOT
        if stale and self._owner == threading.get_ident():
            with self._gate.shared():
                self._drop_snapshot()

    def _writer_loop(self) -> None:
        """The writer thread: take a group of queued batches, commit, release the callers."""
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is _STOP:
                break
            group = [first]
            while len(group) < MAX_GROUP:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stopping = True
                    break
                group.append(item)
            self._commit_group(group)

    def _commit_group(self, group: list[_Request]) -> None:
        outcomes: list[WriteResult | BaseException]
        try:
            outcomes = list(self._transaction([r.batch for r in group]))
        except Exception as exc:  # noqa: BLE001 - every failure is reported to its caller
            if len(group) == 1:
                outcomes = [_translate(exc, "write failed")]
            else:
                log.warning(
                    "group commit of %d batches failed (%s); retrying one by one", len(group), exc
                )
                outcomes = [self._one(r.batch) for r in group]
        by_loop: dict[
            asyncio.AbstractEventLoop,
            list[tuple[asyncio.Future[WriteResult], WriteResult | BaseException]],
        ] = {}
        for request, outcome in zip(group, outcomes, strict=True):
            by_loop.setdefault(request.loop, []).append((request.future, outcome))
        for loop, items in by_loop.items():
            with suppress(RuntimeError):  # the caller's loop is closed; nobody is waiting
                loop.call_soon_threadsafe(_resolve, items)
        self._news.notify()

    def _one(self, batch: _Encoded) -> WriteResult | BaseException:
        try:
            return self._transaction([batch])[0]
        except Exception as exc:  # noqa: BLE001 - reported to the batch's caller
            return _translate(exc, "write failed")

    def _transaction(self, batches: list[_Encoded]) -> list[WriteResult]:
        """Commit ``batches`` in one transaction, growing the map as needed."""
        while True:
            offset = self._last_offset
            try:
                with self._env.begin(write=True) as txn:
                    results = []
                    for batch in batches:
                        result, offset = self._put(txn, batch, offset)
                        results.append(result)
            except lmdb.MapFullError:
                self._grow()
                continue
            self._last_offset = offset
            self._commits += 1
            return results

    def _put(self, txn: Txn, batch: _Encoded, offset: int) -> tuple[WriteResult, int]:
        events, by_entity, states, by_collection, feed, meta = (self._dbs[n] for n in _NAMES[:6])
        new = []
        for event_id, index_key, value in batch.events:
            if txn.put(event_id, value, db=events, overwrite=False):
                txn.put(index_key, b"", db=by_entity)
                new.append(event_id)
        offsets = []
        for key, value, collection_key, row in batch.states:
            if txn.replace(key, value, db=states) is None:
                txn.put(collection_key, b"", db=by_collection)
            offset += 1
            txn.put(offset.to_bytes(8, "big"), row, db=feed, append=True)
            offsets.append(offset)
        for name, content in batch.meta:
            if content is None:
                txn.delete(name, db=meta)
            else:
                txn.put(name, content, db=meta)
        return WriteResult(frozenset(new), tuple(offsets)), offset

    def _grow(self) -> None:
        with self._gate.exclusive():
            size = self._env.info()["map_size"] * 2
            log.info("growing the LMDB map of %s to %d bytes", self.path, size)
            # An idle cached read transaction survives the remap (LMDB 0.9 finds pages
            # through the environment's current map); the bump renews it anyway.
            self._env.set_mapsize(size)
            self._commits += 1

    # ------------------------------------------------------------------ closing

    async def close(self) -> None:
        """Finish queued writes, stop the writer, close the environment, drop the lock."""
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:
            self._queue.put(_STOP)
            await asyncio.to_thread(self._writer.join)
        with self._gate.exclusive():
            self._drop_snapshot()
            self._env.close()
        os.close(self._lock_fd)


def _resolve(items: list[tuple[asyncio.Future[WriteResult], WriteResult | BaseException]]) -> None:
    for future, outcome in items:
        if future.done():
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
