"""``MemoryStorage``: a real engine that keeps everything in memory.

For tests, ephemeral nodes and embedding where durability is not wanted. It is not a test
double: it implements the whole contract of :mod:`mycelia.storage.engine` and passes the
same conformance suite as the durable engines. A write validates the whole batch before it
changes anything, so a failing batch leaves nothing behind.

Events and feed rows are kept as bytes, as a durable engine keeps them, and decoded when
read: an ephemeral node holds every event it ever saw, and as objects they were most of
what the garbage collector walked (about eight tracked objects an event; a full
collection of an editor's client took 185 ms after 20,000 keystrokes). A stored event is
its own canonical bytes, shared with the decoded event it came as. The latest events
written or read stay decoded too (:class:`~mycelia.storage.recent.RecentEvents`, as in
the durable engines, but only :data:`MEMORY_RECENT_EVENTS` of them), since the next
events name them as parents.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Collection, Mapping
from typing import Final

from mycelia.errors import StorageError
from mycelia.proto import AdmittedEvent, Clock, EntityId, EntityState, Event, EventId
from mycelia.proto.query import After, Query, sort_rows
from mycelia.retrieval import StoredState, WriteBatch, WriteResult
from mycelia.retrieval.readahead import events_with_ancestors
from mycelia.storage.engine import (
    STORED_LIMITS,
    DumpRecord,
    FeedEntry,
    MetaRecord,
    encode_values,
    entity_records,
)
from mycelia.storage.recent import RecentEvents
from mycelia.storage.staging import load_batches, stale_load

__all__ = ["MemoryStorage"]

_Row = tuple[bytes, str, bytes | Clock]
"""A feed row as kept: (entity id, collection, head), the id as plain bytes. A head of one
tip (a linear history: nearly every row) is kept as its id's bytes; a wider one as the
state's own clock (copying its ids would cost O(width) a write). A row of plain bytes and
str holds nothing the garbage collector tracks, so it stops tracking the row: an id type
is a Python class, tracked, and the feed keeps a row for every write ever made."""

MEMORY_RECENT_EVENTS: Final = 32
"""How many events a MemoryStorage keeps decoded (the durable engines keep
:data:`~mycelia.storage.recent.RECENT_EVENTS`, which saves them a read; here it saves only a
decode). Each is several objects the garbage collector tracks, kept long enough to be
promoted and visited by full collections. 256 → 32: W3's 200 clients, 602–614 → 574–581
MiB in all, in the same time within this machine's noise; the bench_entity rows unchanged
(a pushed edit's parents are on its entity's head, which admission reads instead)."""


class MemoryStorage:
    """An in-memory storage engine."""

    local_reads: Final = True
    """A read costs no round trip: a walk here asks for an eighth of its read-ahead
    (:func:`~mycelia.retrieval.reads_ahead`); a peer's request for events gets all of it."""

    def __init__(self) -> None:
        # Keys are plain bytes (an id object is one more tracked object per event). Each
        # value holds the event's own canonical bytes object, not a copy: a client's store
        # and the events it has decoded share one. (A pair of atomic values is a tuple the
        # garbage collector stops tracking.)
        self._events: dict[bytes, tuple[int, bytes]] = {}  # event id -> (generation, event)
        # Written or read lately, decoded: few, since the bytes are at hand (a decoded event
        # is a dozen objects; a client holding thousands of them pays in memory and in full
        # collections, while a commit or an ingest reads the latest events, its parents).
        self._recent = RecentEvents(events=MEMORY_RECENT_EVENTS)
        self._by_entity: dict[bytes, list[bytes]] = {}  # entity id -> its event ids
        self._states: dict[EntityId, StoredState] = {}
        self._by_collection: dict[str, dict[EntityId, StoredState]] = {}
        self._feed: list[_Row] = []
        self._plain_ids: dict[EntityId, bytes] = {}  # one bytes copy per id, for its rows
        self._meta: dict[str, bytes] = {}
        self._news: asyncio.Event | None = None  # made by the first waiter, set by a write
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError("this MemoryStorage is closed")

    async def get_events(
        self, ids: Collection[EventId], *, ahead: int = 0
    ) -> Mapping[EventId, AdmittedEvent]:
        """Known events among ``ids`` plus up to ``ahead`` ancestors."""
        self._check_open()
        if ahead:  # (from every stored event: the recent ones may hold few ancestors)
            return events_with_ancestors(self._find, ids, ahead)
        found, rest = self._recent.read(ids, 0)
        if not rest:
            return found
        events = self._events
        read = [self._read(i) for i in rest if i in events]
        if read:
            self._recent.remember(read)
            found.update((e.id, e) for e in read)
        return found

    def _read(self, event_id: EventId) -> AdmittedEvent:
        """A stored event (decoded unless it is among the recent ones)."""
        event = self._recent.get(event_id)
        if event is None:
            generation, canonical = self._events[event_id]
            event = AdmittedEvent(Event.from_bytes(canonical, limits=STORED_LIMITS), generation)
        return event

    def _find(self, event_id: EventId) -> AdmittedEvent | None:
        return self._read(event_id) if event_id in self._events else None

    async def event_stored(self, event_id: EventId) -> bool:
        """Whether the event is stored."""
        self._check_open()
        return event_id in self._events

    async def events_of(self, entity_id: EntityId) -> list[AdmittedEvent]:
        """The entity's events, parents first."""
        self._check_open()
        events = [self._read(EventId._trusted(i)) for i in self._by_entity.get(entity_id, ())]
        return sorted(events, key=lambda e: (e.generation, e.id))

    async def get_state(self, entity_id: EntityId) -> EntityState | None:
        """The stored state, or None."""
        self._check_open()
        stored = self._states.get(entity_id)
        return None if stored is None else stored.state

    async def get_states(self, ids: Collection[EntityId]) -> dict[EntityId, EntityState]:
        """The stored states among ``ids``."""
        self._check_open()
        return {i: self._states[i].state for i in ids if i in self._states}

    async def scan(self, collection: str) -> list[StoredState]:
        """Every state of ``collection``."""
        self._check_open()
        return list(self._by_collection.get(collection, {}).values())

    async def fetch(
        self, collection: str, query: Query, *, after: After | None = None
    ) -> list[StoredState]:
        """The states of ``collection`` matching the bound ``query`` (after ``after``): the
        reference executor (``sort_rows``) over :meth:`scan`; raises InvalidArgument for
        placeholders."""
        self._check_open()
        states = self._by_collection.get(collection, {})
        rows = ((i, s.values) for i, s in states.items())
        if after is not None and not query.order_by:  # id order: the ids after it only
            rows = ((i, v) for i, v in rows if i > after.entity_id)
        ordered = sort_rows(rows, query, after=after)
        return [states[entity_id] for entity_id, _ in ordered]

    async def write(self, batch: WriteBatch) -> WriteResult:
        """Apply the batch atomically (it is checked whole before anything changes)."""
        self._check_open()
        for stored in batch.states:
            if not isinstance(stored.state, EntityState):
                raise StorageError("a write batch holds something that is not a state")
            # The durable engines must encode the values; refusing here too keeps a batch
            # that one engine accepts acceptable to every engine.
            _check_values(stored.values)
        if batch.forget:
            self._recent.forget_entities(set(batch.forget))  # one pass over the recent ones
        for entity_id in batch.forget:
            self._forget(entity_id)
        events, by_entity = self._events, self._by_entity
        new, written = [], []
        for event in batch.events:
            event_id = event.id
            if event_id not in events:
                plain = bytes(event_id)
                events[plain] = (event.generation, event.event.canonical)
                of_entity = by_entity.get(event.entity_id)
                if of_entity is None:
                    of_entity = by_entity[bytes(event.entity_id)] = []
                of_entity.append(plain)
                new.append(event_id)
                written.append(event)
        self._recent.remember(written)
        offsets = []
        feed = self._feed
        for stored in batch.states:
            state = stored.state
            self._states[state.entity_id] = stored
            self._by_collection.setdefault(state.collection, {})[state.entity_id] = stored
            head = state.state.head
            tip = bytes(head.ids[0]) if len(head) == 1 else head
            feed.append((self._plain_id(state.entity_id), state.collection, tip))
            offsets.append(len(feed))
        for key, value in batch.meta:
            if value is None:
                self._meta.pop(key, None)
            else:
                self._meta[key] = value
        news = self._news
        if offsets and news is not None:
            news.set()
            self._news = None
        return WriteResult(frozenset(new), tuple(offsets))

    def _plain_id(self, entity_id: EntityId) -> bytes:
        """The entity id's one plain copy, which its feed rows share."""
        plain = self._plain_ids.get(entity_id)
        if plain is None:
            plain = self._plain_ids[entity_id] = bytes(entity_id)
        return plain

    def _forget(self, entity_id: EntityId) -> None:
        for event_id in self._by_entity.pop(entity_id, ()):
            del self._events[event_id]
        stored = self._states.pop(entity_id, None)
        if stored is not None:
            self._by_collection[stored.state.collection].pop(entity_id, None)

    async def read_since(self, offset: int, *, limit: int = 1000) -> list[FeedEntry]:
        """Feed rows after ``offset``."""
        self._check_open()
        start = max(offset, 0)
        return [
            _entry(start + 1 + i, row) for i, row in enumerate(self._feed[start : start + limit])
        ]

    async def last_offset(self) -> int:
        """The newest offset."""
        self._check_open()
        return len(self._feed)

    async def get_meta(self, key: str) -> bytes | None:
        """A node-level record."""
        self._check_open()
        return self._meta.get(key)

    async def scan_meta(self, prefix: str) -> list[tuple[str, bytes]]:
        """The node-level records under ``prefix``, in key order."""
        self._check_open()
        return sorted((k, v) for k, v in self._meta.items() if k.startswith(prefix))

    async def wait_for_feed(self, offset: int, *, timeout: float) -> bool:
        """Wait for a feed row beyond ``offset`` (or the timeout)."""
        if len(self._feed) > offset:
            return True
        news = self._news
        if news is None:
            news = self._news = asyncio.Event()
        try:
            async with asyncio.timeout(timeout):
                await news.wait()
        except TimeoutError:
            return len(self._feed) > offset
        return True

    async def dump(self) -> AsyncIterator[DumpRecord]:
        """Meta records, then every entity in id order (see ``StorageEngine.dump``)."""
        self._check_open()
        for key in sorted(self._meta):
            yield MetaRecord(key, self._meta[key])
        for raw in sorted(self._by_entity.keys() | self._states.keys()):
            entity_id = EntityId._trusted(raw)
            events = await self.events_of(entity_id)
            for record in entity_records(entity_id, events, self._states.get(entity_id)):
                yield record

    async def load(
        self, records: AsyncIterable[DumpRecord], *, if_offset: int | None = None
    ) -> int:
        """Write a dump stream all or nothing (staged in memory, then one write batch);
        returns how many events it held."""
        self._check_open()
        events: list[AdmittedEvent] = []
        states: list[StoredState] = []
        meta: list[tuple[str, bytes | None]] = []
        async for batch in load_batches(records):
            events.extend(batch.events)
            states.extend(batch.states)
            meta.extend(batch.meta)
        if if_offset is not None and len(self._feed) != if_offset:
            raise stale_load(if_offset, len(self._feed))
        await self.write(WriteBatch(tuple(events), tuple(states), tuple(meta)))
        return len(events)

    async def close(self) -> None:
        """Drop everything, at once: a closed node's events and states are freed as it
        closes, not left to the garbage collector's next full pass (the node's parts hold
        one another in cycles)."""
        self._closed = True
        self._events.clear()
        self._recent = RecentEvents(events=MEMORY_RECENT_EVENTS)
        self._by_entity.clear()
        self._states.clear()
        self._by_collection.clear()
        self._feed.clear()
        self._plain_ids.clear()
        self._meta.clear()


def _entry(offset: int, row: _Row) -> FeedEntry:
    entity_id, collection, head = row
    clock = head if isinstance(head, Clock) else Clock.single(EventId._trusted(head))
    return FeedEntry(offset, EntityId._trusted(entity_id), collection, clock)


_INT_RANGE = range(-(2**63), 2**64)
"""The integers msgpack can encode."""


def _check_values(values: Mapping[str, object]) -> None:
    """Raise StorageError as :func:`encode_values` would, encoding only what needs it:
    a plain scalar (a string, an integer in range, a float, bool, bytes, None) under an
    ASCII name always encodes, and a commit's values are nearly always those.

    A string fails to encode only if it holds a lone surrogate, and no state's values hold
    one: an LWW value is encoded when it is set, a text is Yrs's (which refuses what UTF-8
    cannot encode), a peer's values were decoded. So a string is not encoded again here:
    for a non-ASCII text that was the whole document on every keystroke (150 µs at
    120,000 characters)."""
    for name, value in values.items():
        kind = type(value)
        if (
            type(name) is str
            and name.isascii()
            and (
                value is None
                or kind is bool
                or kind is float
                or kind is bytes
                or (kind is int and value in _INT_RANGE)
                or kind is str
            )
        ):
            continue
        encode_values(values)
        return
