"""The LMDB engine's one writer thread, with group commit (ARCHITECTURE.md §6).

Invariants:

- **One writer.** Every write transaction runs on the :class:`Writer`'s thread. A batch is
  encoded by :func:`encode_batch` on the caller's thread (one that cannot be encoded
  fails alone, before anything is queued); the caller's future is resolved only after the
  transaction holding its batch has committed — with ``durable=True`` that commit
  includes the fsync, so an acknowledged write survives a crash.
- **Group commit.** The writer takes every batch queued while it was busy and commits them
  in one transaction and one fsync. If a group fails, its batches are retried one
  transaction each: a bad batch fails alone, and each batch stays atomic.
- **Feed.** The writer owns the offset counter (:attr:`Writer.last_offset`): offsets are
  assigned in commit order, one per state, strictly increasing and without gaps; a failed
  transaction assigns none. :attr:`Writer.commits` is bumped after every commit (and map
  resize), before any caller is released, so readers can tell their snapshot is old.
- **Indexes** (``by_collection``, ``by_field``) are written in the transaction that writes
  their state (see :mod:`.lmdb_index`).
- **Parts stored aside** (see :mod:`.lmdb_format`) are written in the transaction of their
  state, and only those that changed: the writer remembers the parts it committed last for
  each buffer (:class:`_Committed`, at most :data:`REMEMBERED_BYTES` of them) and compares
  the new ones with those (the same ``bytes`` object, nearly always: a text keeps its base
  and log), or with what is stored when it does not remember. A failed transaction
  remembers nothing of what it put.
- **Map size** grows on demand: a transaction that hits ``MapFullError`` is aborted, the map
  is doubled while no read transaction is open (the :class:`Gate` taken exclusively) and
  the transaction is retried.
- **A load is one transaction** (:class:`Staged`): its batches are read back from the
  load's staging file inside one write transaction (again after a map growth), after
  checking that the feed is still at the offset the load was prepared against; so a load
  is visible whole or not at all.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

import lmdb

from mycelia.errors import StorageError
from mycelia.proto import EntityState, EventId
from mycelia.proto.codec import pack
from mycelia.retrieval import WriteBatch, WriteResult
from mycelia.storage.engine import FeedSignal, encode_feed, encode_values
from mycelia.storage.lmdb_format import (
    ASIDE,
    ASIDE_BYTES,
    Databases,
    Gate,
    aside_backends,
    part_key,
    stored_state,
    translate,
)
from mycelia.storage.lmdb_index import entry_keys, reindex
from mycelia.storage.staging import stale_load

if TYPE_CHECKING:
    Txn = lmdb.Transaction[bytes]

__all__ = [
    "MAX_GROUP",
    "Encoded",
    "Staged",
    "Writer",
    "encode_batch",
    "pack_encoded",
    "unpack_encoded",
]

log = logging.getLogger(__name__)

MAX_GROUP: Final = 512
"""Most batches one group-commit transaction takes."""
REMEMBERED_BYTES: Final = 64 * 1024 * 1024
"""Most bytes of committed parts the writer remembers (the oldest are forgotten first)."""
_STOP: Final = None


@dataclass(frozen=True, slots=True)
class Aside:
    """A buffer stored aside: its backend, its parts and their bytes."""

    name: str
    parts: tuple[bytes, ...]
    size: int


@dataclass(frozen=True, slots=True)
class EncodedState:
    """One state as the writer puts it."""

    key: bytes  # the entity id
    value: bytes  # the ``states`` value
    collection: str
    feed: bytes  # the feed row
    index: frozenset[bytes]  # its ``by_field`` keys
    aside: tuple[Aside, ...] = ()  # the buffers stored aside


@dataclass(frozen=True, slots=True)
class Encoded:
    """A write batch as the writer puts it: keys and values, ready to write."""

    events: tuple[tuple[EventId, bytes, bytes], ...]  # id, by_entity key, value
    states: tuple[EncodedState, ...]
    meta: tuple[tuple[bytes, bytes | None], ...]
    forget: tuple[bytes, ...] = ()  # entity ids, dropped before the rest is put

    def __bool__(self) -> bool:
        return bool(self.events or self.states or self.meta or self.forget)


@dataclass(frozen=True, slots=True)
class Staged:
    """A load: encoded batches read back from its staging file, committed as one."""

    batches: Callable[[], Iterator[Encoded]]
    """Every batch of the load, from the start (called again after a map growth)."""
    if_offset: int | None
    """The feed offset the load was prepared against (None: any)."""


@dataclass(slots=True)
class _Request:
    batch: Encoded | Staged
    future: asyncio.Future[WriteResult]
    loop: asyncio.AbstractEventLoop


def encode_batch(batch: WriteBatch) -> Encoded:
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
        raw, aside = _stored_aside(state)
        prefix = len(raw) | (ASIDE if aside else 0)
        value = prefix.to_bytes(4, "big") + raw + encode_values(stored.values)
        entity = bytes(state.entity_id)
        feed = encode_feed(state.entity_id, state.collection, state.state.head)
        index = entry_keys(state.collection, entity, stored.values)
        states.append(EncodedState(entity, value, state.collection, feed, index, aside))
    meta = tuple((k.encode(), v) for k, v in batch.meta)
    return Encoded(events, tuple(states), meta, tuple(bytes(e) for e in batch.forget))


def _stored_aside(state: EntityState) -> tuple[bytes, tuple[Aside, ...]]:
    """The state's stored bytes, and the buffers in them stored aside (parts of
    :data:`ASIDE_BYTES` or more: their count is in the bytes, in the buffer's place)."""
    head, generations, buffers = state.state.to_stored()
    aside = []
    for item in cast("list[list[Any]]", buffers):
        name, buffer = item
        if type(buffer) is list and (size := sum([len(p) for p in buffer])) >= ASIDE_BYTES:
            aside.append(Aside(name, tuple(buffer), size))
            item[1] = len(buffer)
    return pack([state.entity_id, state.collection, [head, generations, buffers]]), tuple(aside)


def pack_encoded(batch: Encoded) -> list[object]:
    """``batch`` as msgpack-ready lists (for a load's staging file)."""
    states = [
        [
            s.key,
            s.value,
            s.collection,
            s.feed,
            sorted(s.index),
            [[a.name, list(a.parts), a.size] for a in s.aside],
        ]
        for s in batch.states
    ]
    return [
        [list(e) for e in batch.events],
        states,
        [list(m) for m in batch.meta],
        list(batch.forget),
    ]


def unpack_encoded(item: object) -> Encoded:
    """Undo :func:`pack_encoded`. The staging file is this process's own, written moments
    ago, so its shapes are trusted."""
    events, states, meta, forget = cast("list[list[Any]]", item)
    return Encoded(
        tuple((EventId._trusted(i), k, v) for i, k, v in events),
        tuple(
            EncodedState(
                k, v, c, f, frozenset(ix), tuple(Aside(n, tuple(p), z) for n, p, z in aside)
            )
            for k, v, c, f, ix, aside in states
        ),
        tuple((k, v) for k, v in meta),
        tuple(forget),
    )


class _Committed:
    """The parts committed last for each buffer stored aside, as far as remembered: at most
    :data:`REMEMBERED_BYTES` of them, the least recently written forgotten first."""

    def __init__(self) -> None:
        self._parts: dict[tuple[bytes, str], Aside] = {}
        self._bytes = 0

    def get(self, key: tuple[bytes, str]) -> Aside | None:
        return self._parts.get(key)

    def update(self, committed: dict[tuple[bytes, str], Aside | None]) -> None:
        """Remember ``committed`` (no parts: a buffer no longer stored aside; None: parts
        a transaction put without remembering them)."""
        parts = self._parts
        for key, new in committed.items():
            old = parts.pop(key, None)
            if old is not None:
                self._bytes -= old.size
            if new is not None and new.parts:
                parts[key] = new
                self._bytes += new.size
        while self._bytes > REMEMBERED_BYTES and parts:
            self._bytes -= parts.pop(next(iter(parts))).size


class Writer:
    """The writer thread of one store (see the module docstring)."""

    def __init__(
        self,
        env: lmdb.Environment,
        dbs: Databases,
        *,
        gate: Gate,
        news: FeedSignal,
        path: Path,
        last_offset: int,
    ) -> None:
        self.env = env
        self.dbs = dbs
        self.gate = gate
        self.news = news
        self.path = path
        self.last_offset = last_offset
        """The largest committed offset."""
        self.commits = 0
        """Committed write transactions (and map resizes) so far."""
        self._queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._committed = _Committed()
        self._putting: dict[tuple[bytes, str], Aside | None] = {}
        """Parts put by the transaction under way (remembered once it commits), at most
        :data:`REMEMBERED_BYTES` of them: past that (a large load), None, and what is
        stored is read back from the transaction when needed."""
        self._putting_bytes = 0

    def start(self) -> None:
        """Start the writer thread."""
        self._thread = threading.Thread(
            target=self._loop, name=f"mycelia-lmdb-writer:{self.path}", daemon=True
        )
        self._thread.start()

    async def submit(self, batch: Encoded | Staged) -> WriteResult:
        """Queue ``batch``; returns once its transaction has committed (raises if it failed)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[WriteResult] = loop.create_future()
        self._queue.put(_Request(batch, future, loop))
        return await future

    async def stop(self) -> None:
        """Finish the queued batches and stop the thread."""
        if self._thread is not None:
            self._queue.put(_STOP)
            await asyncio.to_thread(self._thread.join)
            self._thread = None

    def _loop(self) -> None:
        """Take a group of queued batches, commit, release the callers; until stopped."""
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
                outcomes = [translate(exc, "write failed")]
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
        self.news.notify()

    def _one(self, batch: Encoded | Staged) -> WriteResult | BaseException:
        try:
            return self._transaction([batch])[0]
        except Exception as exc:  # noqa: BLE001 - reported to the batch's caller
            return translate(exc, "write failed")

    def _transaction(self, batches: list[Encoded | Staged]) -> list[WriteResult]:
        """Commit ``batches`` in one transaction, growing the map as needed."""
        while True:
            offset = self.last_offset
            self._putting, self._putting_bytes = {}, 0
            try:
                with self.env.begin(write=True) as txn:
                    results = []
                    for batch in batches:
                        if isinstance(batch, Staged):
                            result, offset = self._put_staged(txn, batch, offset)
                        else:
                            result, offset = self._put(txn, batch, offset)
                        results.append(result)
            except lmdb.MapFullError:
                self._grow()
                continue
            self._committed.update(self._putting)
            self.last_offset = offset
            self.commits += 1
            return results

    def _put(self, txn: Txn, batch: Encoded, offset: int) -> tuple[WriteResult, int]:
        dbs = self.dbs
        for entity in batch.forget:
            self._forget(txn, entity)
        new = []
        for event_id, index_key, value in batch.events:
            if txn.put(event_id, value, db=dbs[b"events"], overwrite=False):
                txn.put(index_key, b"", db=dbs[b"by_entity"])
                new.append(event_id)
        offsets = []
        for state in batch.states:
            previous = txn.replace(state.key, state.value, db=dbs[b"states"])
            if previous is None:
                collection_key = state.collection.encode() + b"\0" + state.key
                txn.put(collection_key, b"", db=dbs[b"by_collection"])
            reindex(
                txn, dbs[b"by_field"], collection=state.collection, entity_id=state.key,
                previous=previous, keys=state.index,
            )  # fmt: skip
            if state.aside or (previous is not None and int.from_bytes(previous[:4]) & ASIDE):
                self._put_aside(txn, state, previous)
            offset += 1
            txn.put(offset.to_bytes(8, "big"), state.feed, db=dbs[b"feed"], append=True)
            offsets.append(offset)
        for name, content in batch.meta:
            if content is None:
                txn.delete(name, db=dbs[b"meta"])
            else:
                txn.put(name, content, db=dbs[b"meta"])
        return WriteResult(frozenset(new), tuple(offsets)), offset

    def _put_aside(self, txn: Txn, state: EncodedState, previous: bytes | None) -> None:
        """Put the parts of ``state``'s buffers stored aside that differ from those stored,
        and delete the stored ones it no longer has."""
        db = self.dbs[b"parts"]
        entity, putting = state.key, self._putting
        for aside in state.aside:
            name, parts, key = aside.name, aside.parts, (entity, aside.name)
            known = putting[key] if key in putting else self._committed.get(key)
            if known is not None:
                stored = known.parts
                self._putting_bytes -= known.size if key in putting else 0
            else:  # not remembered: what the transaction holds
                stored = tuple(_stored_parts(txn, db, entity, name))
            for index, part in enumerate(parts):
                if index >= len(stored) or not (stored[index] is part or stored[index] == part):
                    txn.put(part_key(entity, name, index), part, db=db)
            for index in range(len(parts), len(stored)):
                txn.delete(part_key(entity, name, index), db=db)
            self._putting_bytes += aside.size
            putting[key] = aside if self._putting_bytes <= REMEMBERED_BYTES else None
        kept = {aside.name for aside in state.aside}
        for name in [] if previous is None else aside_backends(previous):
            if name not in kept:
                self._drop_parts(txn, entity, name)

    def _drop_parts(self, txn: Txn, entity: bytes, name: str) -> None:
        db = self.dbs[b"parts"]
        for key in _keys_from(txn, db, part_key(entity, name, 0)[:-4]):
            txn.delete(key, db=db)
        self._putting[(entity, name)] = Aside(name, (), 0)

    def _put_staged(self, txn: Txn, load: Staged, offset: int) -> tuple[WriteResult, int]:
        if load.if_offset is not None and offset != load.if_offset:
            raise stale_load(load.if_offset, offset)
        new: set[EventId] = set()
        offsets: list[int] = []
        for batch in load.batches():
            result, offset = self._put(txn, batch, offset)
            new |= result.new_events
            offsets.extend(result.offsets)
        return WriteResult(frozenset(new), tuple(offsets)), offset

    def _forget(self, txn: Txn, entity: bytes) -> None:
        """Drop an entity whole: its events, their index rows, its state and its indexes."""
        dbs = self.dbs
        for key in _keys_from(txn, dbs[b"by_entity"], entity):
            txn.delete(key, db=dbs[b"by_entity"])
            txn.delete(key[-32:], db=dbs[b"events"])
        previous = txn.pop(entity, db=dbs[b"states"])
        if previous is not None:
            collection = stored_state(previous, txn, dbs).collection
            for name in aside_backends(previous):
                self._drop_parts(txn, entity, name)
            txn.delete(collection.encode() + b"\0" + entity, db=dbs[b"by_collection"])
            reindex(
                txn, dbs[b"by_field"], collection=collection, entity_id=entity,
                previous=previous, keys=frozenset(),
            )  # fmt: skip

    def _grow(self) -> None:
        with self.gate.exclusive():
            size = self.env.info()["map_size"] * 2
            log.info("growing the LMDB map of %s to %d bytes", self.path, size)
            # An idle cached read transaction survives the remap (LMDB 0.9 finds pages
            # through the environment's current map); the bump renews it anyway.
            self.env.set_mapsize(size)
            self.commits += 1


def _keys_from(txn: Txn, db: lmdb._Database, prefix: bytes) -> list[bytes]:
    """Every key of ``db`` that starts with ``prefix``, ascending."""
    cursor = txn.cursor(db=db)
    keys = []
    if cursor.set_range(prefix):
        for key in cursor.iternext(keys=True, values=False):
            if not key.startswith(prefix):
                break
            keys.append(key)
    return keys


def _stored_parts(txn: Txn, db: lmdb._Database, entity: bytes, name: str) -> list[bytes]:
    """The parts stored for ``entity``'s ``name`` buffer, in order (index 0 up, contiguous)."""
    parts: list[bytes] = []
    while (part := txn.get(part_key(entity, name, len(parts)), db=db)) is not None:
        parts.append(part)
    return parts


def _resolve(items: list[tuple[asyncio.Future[WriteResult], WriteResult | BaseException]]) -> None:
    for future, outcome in items:
        if future.done():
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
