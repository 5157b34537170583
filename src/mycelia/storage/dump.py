"""Portable dumps: stream any engine's content to a file and load it into any engine.

Format (version 1): a stream of msgpack values, one after another, no framing::

    ["mycelia-dump", 1]                                  header: magic, format version
    ["meta", key: str, value: bin]                       node-level records, first
    ["events", entity_id: bin, [[generation, event: bin], ...]]   parents first
    ["state", entity_id: bin, state: bin, values: bin]   after the entity's events
    ["end", entities: int, events: int]                  trailer: counts, proves no truncation

Entities come in id order; a long history spans several ``events`` records of the same
entity, followed by its ``state`` (if it has one). ``event`` is the event's canonical
bytes, ``state`` :meth:`~mycelia.proto.EntityState.to_bytes`, ``values``
:func:`~mycelia.storage.engine.encode_values`.

Invariants of :func:`load_from`:

- every event id is **recomputed** from its bytes (nothing in the file names an id it is
  not checked against), every event must belong to the entity of its record, and every
  generation is recomputed from the parents when they are in the dump (a generation is
  taken from the file only for an event whose parents the dump does not hold, which only
  a dump of an ephemeral node contains);
- a state's head must name events the dump holds for that entity (when it holds any), so a
  damaged event cannot load next to a state that still names the original;
- a state is written no earlier than its entity's events, so a load that stops part-way
  (bad record, crash) leaves a consistent store, and re-running it is harmless;
- bad input raises :class:`~mycelia.errors.DecodeError` (``IdMismatch``, ``InvalidEvent``),
  a missing trailer or wrong counts included.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import IO, Final

import msgpack

from mycelia.errors import DecodeError, InvalidEvent, MyceliaError
from mycelia.proto import AdmittedEvent, EntityId, EntityState, Event
from mycelia.proto.codec import expect_bytes, expect_int, expect_list, expect_str
from mycelia.proto.ids import ID_LENGTH
from mycelia.retrieval import StoredState
from mycelia.storage.engine import (
    STORED_LIMITS,
    DumpRecord,
    EntityRecord,
    MetaRecord,
    StorageEngine,
    decode_values,
    encode_values,
)

__all__ = ["FORMAT_VERSION", "MAGIC", "DumpProgress", "dump_to", "load_from"]

MAGIC: Final = "mycelia-dump"
FORMAT_VERSION: Final = 1
_CHUNK: Final = 1 << 20


@dataclass
class DumpProgress:
    """Counts so far, passed to the progress callback after each entity."""

    entities: int = 0
    events: int = 0
    size: int = 0
    """Bytes written so far (dump only)."""
    _last: bytes | None = field(default=None, repr=False)

    def saw(self, entity_id: bytes, events: int) -> None:
        if entity_id != self._last:
            self.entities += 1
            self._last = entity_id
        self.events += events


Progress = Callable[[DumpProgress], None]


async def dump_to(
    engine: StorageEngine, fileobj: IO[bytes], progress: Progress | None = None
) -> DumpProgress:
    """Write everything ``engine`` holds to ``fileobj`` (see the module docstring).

    Writes go out in chunks of about 1 MiB from a worker thread. Returns the final counts.
    """
    packer = msgpack.Packer(use_bin_type=True)
    buffer = bytearray(packer.pack([MAGIC, FORMAT_VERSION]))
    counts = DumpProgress()
    async for record in engine.dump():
        if isinstance(record, MetaRecord):
            buffer += packer.pack(["meta", record.key, record.value])
            continue
        counts.saw(record.entity_id, len(record.events))
        if record.events:
            events = [[e.generation, e.to_bytes()] for e in record.events]
            buffer += packer.pack(["events", bytes(record.entity_id), events])
        if record.state is not None:
            state, values = record.state.state.to_bytes(), encode_values(record.state.values)
            buffer += packer.pack(["state", bytes(record.entity_id), state, values])
        if len(buffer) >= _CHUNK:
            counts.size += len(buffer)
            await asyncio.to_thread(fileobj.write, bytes(buffer))
            buffer.clear()
        if progress is not None:
            progress(counts)
    buffer += packer.pack(["end", counts.entities, counts.events])
    counts.size += len(buffer)
    await asyncio.to_thread(fileobj.write, bytes(buffer))
    await asyncio.to_thread(fileobj.flush)
    if progress is not None:
        progress(counts)
    return counts


async def _items(fileobj: IO[bytes]) -> AsyncIterator[object]:
    """The msgpack values of a stream, read in chunks from a worker thread."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=1 << 31, strict_map_key=True)
    while chunk := await asyncio.to_thread(fileobj.read, _CHUNK):
        unpacker.feed(chunk)
        try:
            for item in unpacker:
                yield item
        except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
            raise DecodeError(f"the dump is not a valid msgpack stream: {exc}") from exc


class _Reader:
    """Turns dump items into verified :class:`DumpRecord` values."""

    def __init__(self, progress: Progress | None) -> None:
        self.progress = progress
        self.counts = DumpProgress()
        self.entity: EntityId | None = None
        self.generations: dict[bytes, int] = {}
        self.ended = False

    def header(self, item: object) -> None:
        magic, version = expect_list(item, "dump header", length=2)
        if magic != MAGIC:
            raise DecodeError("this is not a Mycelia dump (bad magic)")
        if version != FORMAT_VERSION:
            raise DecodeError(f"dump format {version!r} is not supported (only {FORMAT_VERSION})")

    def record(self, item: object) -> DumpRecord | None:
        if self.ended:
            raise DecodeError("the dump continues after its trailer")
        fields = expect_list(item, "dump record")
        kind = expect_str(fields[0] if fields else None, "dump record kind")
        if kind == "meta":
            _, key, value = expect_list(item, "meta record", length=3)
            return MetaRecord(expect_str(key, "meta key"), expect_bytes(value, "meta value"))
        if kind == "events":
            _, entity, events = expect_list(item, "events record", length=3)
            return self.events(self.enter(entity), expect_list(events, "events"))
        if kind == "state":
            _, entity, state, values = expect_list(item, "state record", length=4)
            return self.state(self.enter(entity), state, values)
        if kind == "end":
            _, entities, events = expect_list(item, "trailer", length=3)
            if (expect_int(entities, "entities"), expect_int(events, "events")) != (
                self.counts.entities,
                self.counts.events,
            ):
                raise DecodeError("the dump's trailer does not match its content")
            self.ended = True
            return None
        raise DecodeError(f"unknown dump record kind {kind!r}")

    def enter(self, raw: object) -> EntityId:
        entity = EntityId._trusted(expect_bytes(raw, "entity id", length=ID_LENGTH))
        if entity != self.entity:
            self.entity, self.generations = entity, {}
            self.counts.saw(entity, 0)
        return entity

    def events(self, entity: EntityId, items: list[object]) -> EntityRecord:
        admitted = []
        for item in items:
            generation_raw, body = expect_list(item, "dumped event", length=2)
            event = Event.from_bytes(expect_bytes(body, "event bytes"), limits=STORED_LIMITS)
            if event.entity_id != entity:
                raise InvalidEvent(f"event {event.id} is filed under entity {entity}")
            generation = expect_int(generation_raw, "generation", minimum=1)
            parents = [self.generations.get(p) for p in event.parent]
            if all(g is not None for g in parents):
                expected = 1 + max((g for g in parents if g is not None), default=0)
                if generation != expected:
                    raise InvalidEvent(
                        f"event {event.id} has generation {generation}, not {expected}"
                    )
            self.generations[event.id] = generation
            admitted.append(AdmittedEvent(event, generation))
        self.counts.events += len(admitted)
        return EntityRecord(entity, tuple(admitted), None)

    def state(self, entity: EntityId, state: object, values: object) -> EntityRecord:
        decoded = EntityState.from_bytes(expect_bytes(state, "state"), limits=STORED_LIMITS)
        if decoded.entity_id != entity:
            raise DecodeError(f"a state of {decoded.entity_id} is filed under entity {entity}")
        # A state may only name events the dump holds for its entity (unless the dump holds
        # none: an ephemeral node's snapshot). Otherwise a forged or damaged event would
        # load and leave a state whose head references a missing event.
        if self.generations and any(h not in self.generations for h in decoded.state.head):
            raise InvalidEvent(f"the state of {entity} names head events its dump does not hold")
        try:
            stored = StoredState(decoded, decode_values(expect_bytes(values, "values")))
        except MyceliaError as exc:
            raise DecodeError(f"the values of {entity} do not decode: {exc}") from exc
        if self.progress is not None:
            self.progress(self.counts)
        return EntityRecord(entity, (), stored)


async def load_from(
    fileobj: IO[bytes], engine: StorageEngine, progress: Progress | None = None
) -> DumpProgress:
    """Load a dump from ``fileobj`` into ``engine``, verifying it (see the module docstring).

    Returns the counts loaded. Raises DecodeError for a damaged, forged or truncated dump;
    what was loaded before the bad record stays (consistent, and a re-run is harmless).
    """
    reader = _Reader(progress)

    async def records() -> AsyncIterator[DumpRecord]:
        items = _items(fileobj)
        try:
            reader.header(await anext(items))
        except StopAsyncIteration:
            raise DecodeError("the dump is empty") from None
        async for item in items:
            record = reader.record(item)
            if record is not None:
                yield record
        if not reader.ended:
            raise DecodeError("the dump is truncated (no trailer)")

    await engine.load(records())
    if progress is not None:
        progress(reader.counts)
    return reader.counts
