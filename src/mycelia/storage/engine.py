"""The storage-engine contract (ARCHITECTURE.md §6).

Every engine (memory, LMDB, PostgreSQL) satisfies :class:`StorageEngine` and passes the
same conformance suite (:mod:`mycelia.storage.testing`):

- events are added idempotently (re-adding reports "already had it") with their
  generation; read by id (with optional read-ahead) and by entity (parents first);
- states are read and written per entity; a missing one is ``None`` from ``get_state``;
- a batch may **forget** entities (``WriteBatch.forget``): their events, state and index
  rows are gone before the rest of the batch is written (an ephemeral node's cache uses
  it to drop what its durable peer refused); meta records are read one by key or by key
  prefix (``scan_meta``, in key order);
- :meth:`StorageEngine.write` is **atomic**: events, states, meta and change-feed rows of
  one batch become durable together or not at all, and a batch's events are durable no
  later than the states that reference them;
- the change feed gives every written state a strictly increasing offset; ``read_since``
  never skips a committed batch;
- engines translate their backend's exceptions to :class:`~mycelia.errors.StorageError`
  subclasses, chained with ``from``;
- ``fetch(collection, query)`` returns exactly what ``sort_rows`` over ``scan(collection)``
  returns (the same rows, in the same order, LIMIT applied), whatever an engine pushes
  down (:mod:`mycelia.storage.plan`; the shared query case file pins it);
- every engine can stream its whole content out (:meth:`StorageEngine.dump`, entity by
  entity, events parents first, the state last) and take such a stream in
  (:meth:`StorageEngine.load`), which is how :mod:`mycelia.storage.dump` moves a store
  between engines. A load is **all or nothing**: the stream is staged outside the store
  (:mod:`mycelia.storage.staging`) and committed in one transaction once it has been read
  to its end, so a stream that fails part-way (a cut or forged dump) writes nothing, and
  ``if_offset`` refuses the commit if a state was written since the loader read the
  states it merged with.

State values are stored as :func:`encode_values` bytes on the durable engines; a value
that cannot be encoded fails the whole batch (every engine checks it, memory included).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Final, Protocol

import msgpack

from mycelia.errors import DecodeError, StorageCorrupt, StorageError
from mycelia.proto import AdmittedEvent, Clock, EntityId, EventId, Limits
from mycelia.proto.codec import canonical_value, pack
from mycelia.proto.ids import shared_event_id
from mycelia.proto.query import After, Query
from mycelia.retrieval import EntityStore, StoredState

__all__ = [
    "STORED_LIMITS",
    "DumpRecord",
    "EntityRecord",
    "FeedEntry",
    "FeedSignal",
    "MetaRecord",
    "StorageEngine",
    "decode_feed",
    "decode_values",
    "encode_feed",
    "encode_values",
    "entity_records",
]

STORED_LIMITS: Final = Limits(
    max_frame_bytes=1 << 31,
    max_batch_events=1 << 20,
    max_parents=1 << 16,
    max_clock_width=1 << 16,
    max_operation_bytes=1 << 31,
    max_string_length=1 << 31,
)
"""Limits for decoding what an engine stored itself: it was validated on admission under
the node's own limits (which may be wider than the defaults), so only the shape is
re-checked on the way out."""


@dataclass(frozen=True, slots=True)
class FeedEntry:
    """One change-feed row: a state written at ``offset``."""

    offset: int
    entity_id: EntityId
    collection: str
    head: Clock


@dataclass(frozen=True, slots=True)
class MetaRecord:
    """One node-level record in a dump."""

    key: str
    value: bytes


@dataclass(frozen=True, slots=True)
class EntityRecord:
    """A slice of one entity in a dump: some of its events, parents first.

    A long history spans several consecutive records of the same entity; only the last
    carries the state (``None`` before, and for an entity stored without a state).
    """

    entity_id: EntityId
    events: tuple[AdmittedEvent, ...]
    state: StoredState | None


DumpRecord = MetaRecord | EntityRecord
"""What :meth:`StorageEngine.dump` yields: every meta record first, then every entity."""


def encode_values(values: Mapping[str, object]) -> bytes:
    """Canonical msgpack of a state's values; raises StorageError if one cannot be stored."""
    try:
        return pack(canonical_value(dict(values)))
    except (DecodeError, TypeError, ValueError) as exc:
        raise StorageError(f"state values cannot be stored: {exc}") from exc


def decode_values(data: bytes) -> dict[str, object]:
    """Decode :func:`encode_values`; raises StorageCorrupt if the bytes are not that."""
    try:
        values = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:
        raise StorageCorrupt(f"stored values do not decode: {exc!r}") from exc
    if not isinstance(values, dict):
        raise StorageCorrupt("stored values are not a map")
    return values


def encode_feed(entity_id: EntityId, collection: str, head: Clock) -> bytes:
    """The stored form of one feed row (without its offset)."""
    return pack((entity_id, collection, b"".join(head.ids)))


def decode_feed(offset: int, data: bytes) -> FeedEntry:
    """Decode :func:`encode_feed`; raises StorageCorrupt if the bytes are not that."""
    try:
        entity, collection, head = msgpack.unpackb(data, raw=False)
        ids = [shared_event_id(head[i : i + 32]) for i in range(0, len(head), 32)]
        return FeedEntry(offset, EntityId._trusted(entity), collection, Clock(ids))
    except Exception as exc:
        raise StorageCorrupt(f"feed row {offset} does not decode: {exc!r}") from exc


class FeedSignal:
    """Wakes ``wait_for_feed`` callers on any event loop, from any thread.

    A hint only: a woken caller re-checks its condition, and so does every caller that
    registers, so a wake between a check and a registration is never lost.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def notify(self) -> None:
        """Wake every current waiter (safe from any thread)."""
        with self._lock:
            waiters, self._waiters = self._waiters, []
        for loop, waiter in waiters:
            with suppress(RuntimeError):  # that loop is closed: nobody waits any more
                loop.call_soon_threadsafe(_wake, waiter)

    async def wait(self, has_news: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``has_news()`` or ``timeout`` seconds; returns ``has_news()``."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                while not has_news():
                    entry = (loop, loop.create_future())
                    with self._lock:
                        self._waiters.append(entry)
                    try:
                        if not has_news():  # checked after registering: no wake is missed
                            await entry[1]
                    finally:
                        with self._lock:
                            if entry in self._waiters:
                                self._waiters.remove(entry)
        except TimeoutError:
            pass
        return has_news()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class StorageEngine(EntityStore, Protocol):
    """What a node needs from durable (or in-memory) storage."""

    async def event_stored(self, event_id: EventId) -> bool:
        """Whether ``event_id`` is stored (durably, on a durable engine)."""
        ...

    async def events_of(self, entity_id: EntityId) -> list[AdmittedEvent]:
        """Every stored event of ``entity_id``, parents first (by generation, then id)."""
        ...

    async def scan(self, collection: str) -> list[StoredState]:
        """Every stored state of ``collection`` with its values (queries fall back to it)."""
        ...

    async def fetch(
        self, collection: str, query: Query, *, after: After | None = None
    ) -> list[StoredState]:
        """The states of ``collection`` matching the bound ``query``, in its order, at most
        its limit: exactly ``sort_rows`` over :meth:`scan` (ARCHITECTURE.md §8), pushed
        down where the engine can. With ``after`` (a keyset position, ``After.row`` of the
        last row read), only the rows after it in the query's order: a result is read a
        page at a time. A page costs about its own rows, not the result's, when the query
        has no ORDER BY (id order) or is ordered by the field its index plan reads (an
        ordered plan: see :mod:`mycelia.storage.plan`). Raises InvalidArgument if
        ``query`` has placeholders."""
        ...

    async def read_since(self, offset: int, *, limit: int = 1000) -> list[FeedEntry]:
        """Feed rows with offsets greater than ``offset``, ascending, at most ``limit``."""
        ...

    async def last_offset(self) -> int:
        """The largest offset written so far (0 before any write)."""
        ...

    async def get_meta(self, key: str) -> bytes | None:
        """A node-level record written through ``WriteBatch.meta``."""
        ...

    async def scan_meta(self, prefix: str) -> list[tuple[str, bytes]]:
        """Every node-level record whose key starts with ``prefix``, in key order."""
        ...

    async def wait_for_feed(self, offset: int, *, timeout: float) -> bool:
        """Wait until the feed has a row beyond ``offset`` or ``timeout`` passes.

        Returns whether there is news. A hint only: callers re-read from their offset.
        """
        ...

    def dump(self) -> AsyncIterator[DumpRecord]:
        """Stream everything: meta records, then each entity's events (parents first) and
        state, entities in id order. Reads in short transactions, so writes may proceed;
        what a concurrent write adds may or may not appear."""
        ...

    async def load(
        self, records: AsyncIterable[DumpRecord], *, if_offset: int | None = None
    ) -> int:
        """Write a :meth:`dump` stream **all or nothing**; returns how many events it held.

        Nothing is visible until the whole stream has been read, then all of it at once. If
        the stream raises, or the commit fails, nothing is written. ``if_offset``: the
        feed's last offset the records were prepared against; if a state was written
        since (the offset moved), the load raises StorageError and writes nothing. The
        records are trusted: :func:`mycelia.storage.dump.load_from` verifies a file first.
        """
        ...

    async def close(self) -> None:
        """Release the engine's resources; further use raises StorageError."""
        ...


def entity_records(
    entity_id: EntityId,
    events: list[AdmittedEvent],
    state: StoredState | None,
    *,
    chunk: int = 1000,
) -> list[EntityRecord]:
    """One entity's dump records: its events (parents first) in slices of ``chunk``, the
    state with the last slice."""
    slices = [tuple(events[i : i + chunk]) for i in range(0, len(events), chunk)] or [()]
    records = [EntityRecord(entity_id, s, None) for s in slices[:-1]]
    records.append(EntityRecord(entity_id, slices[-1], state))
    return records
