"""Portable dumps: stream any engine's content to a file and load it into any engine.

Format (version 2): a stream of msgpack values, one after another, no framing::

    ["mycelia-dump", 2, kind]                            header: magic, version, kind
    ["meta", key: str, value: bin]                       node-level records, first
    ["events", entity_id: bin, [[generation, event: bin], ...]]   parents first
    ["state", entity_id: bin, state: bin, values: bin]   after the entity's events
    ["end", entities: int, events: int]                  trailer: counts, proves no truncation

Entities come in strictly increasing id order; a long history spans several ``events``
records of the same entity, followed by its ``state`` (if it has one). ``event`` is the
event's canonical bytes, ``state`` :meth:`~mycelia.proto.EntityState.to_bytes`, ``values``
:func:`~mycelia.storage.engine.encode_values`. Version 1 (header ``["mycelia-dump", 1]``)
is read as a durable dump.

**Dump kinds.** ``"durable"``: every entity's whole history is in the dump, genesis first
and parents before children, and its state is what those events give: what a durable
node's store holds, and what :func:`dump_to` writes unless told ``ephemeral=True`` (it
refuses a store that does not live up to it). ``"ephemeral"``: a cache's dump, as an
ephemeral node's store holds — state snapshots without their events, and events on top
of them whose parents are missing (ARCHITECTURE.md §7). Only an ephemeral dump may hold
those, and they load only into a store that is not durable (``load_from(...,
durable=False)``): there is no signature on a state to check it by, and a durable store
must never hold a head naming events it lacks.

Invariants of :func:`load_from` (**it trusts nothing in the file**):

- every event id is recomputed from its bytes, every generation from the parents, and
  every state with its history in the dump is recomputed from its events and must equal
  the dumped one (:mod:`mycelia.storage.dump_check`); every meta value has the form its
  key requires (:mod:`mycelia.storage.meta`), and every genesis binds the dump's system;
- into a store that holds anything, a dump loads only if its system root and node key are
  the store's own (ForeignSystem, ForeignNode otherwise); the dump's meta records then only
  add keys the store lacks;
- a loaded state never moves a stored one backwards: it is merged with it
  (:func:`~mycelia.storage.dump_check.merge_with_stored`);
- **all or nothing**: the verified records are staged by the engine and committed in one
  transaction after the trailer checked out (:meth:`StorageEngine.load`), refused if
  the store's feed moved meanwhile; bad input raises a DecodeError subclass
  (``IdMismatch``, ``InvalidEvent``, ``InvalidState``), a missing trailer or wrong
  counts included, and nothing of it is written.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import IO, Final

import msgpack

from mycelia.errors import (
    DecodeError,
    ForeignNode,
    ForeignSystem,
    InvalidArgument,
    InvalidState,
    MyceliaError,
)
from mycelia.proto import EntityId, EntityState, Event
from mycelia.proto.codec import expect_bytes, expect_int, expect_list, expect_str
from mycelia.proto.ids import ID_LENGTH
from mycelia.retrieval import StoredState
from mycelia.storage.dump_check import EntityCheck, Rules, merge_with_stored
from mycelia.storage.engine import (
    STORED_LIMITS,
    DumpRecord,
    EntityRecord,
    MetaRecord,
    StorageEngine,
    decode_values,
    encode_values,
)
from mycelia.storage.meta import NODE_KEY, SYSTEM_ROOT, check_meta

__all__ = [
    "DURABLE",
    "EPHEMERAL",
    "FORMAT_VERSION",
    "MAGIC",
    "DumpProgress",
    "dump_to",
    "load_from",
]

MAGIC: Final = "mycelia-dump"
FORMAT_VERSION: Final = 2
DURABLE: Final = "durable"
EPHEMERAL: Final = "ephemeral"
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
    engine: StorageEngine,
    fileobj: IO[bytes],
    progress: Progress | None = None,
    *,
    ephemeral: bool = False,
) -> DumpProgress:
    """Write everything ``engine`` holds to ``fileobj`` (see the module docstring).

    ``ephemeral``: write an ephemeral dump (a cache's store). A durable dump (the default)
    raises InvalidArgument at the first entity whose history is not whole. Writes go out
    in chunks of about 1 MiB from a worker thread. Returns the final counts.
    """
    packer = msgpack.Packer(use_bin_type=True)
    buffer = bytearray(packer.pack([MAGIC, FORMAT_VERSION, EPHEMERAL if ephemeral else DURABLE]))
    counts = DumpProgress()
    history: set[bytes] = set()
    async for record in engine.dump():
        if isinstance(record, MetaRecord):
            buffer += packer.pack(["meta", record.key, record.value])
            continue
        if record.entity_id != counts._last:
            history = set()
        counts.saw(record.entity_id, len(record.events))
        if not ephemeral:
            _check_whole(record, history)
        buffer += _packed(packer, record)
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


def _packed(packer: msgpack.Packer, record: EntityRecord) -> bytes:
    """The ``events`` and ``state`` records of one slice of an entity."""
    out = b""
    if record.events:
        events = [[e.generation, e.to_bytes()] for e in record.events]
        out += packer.pack(["events", bytes(record.entity_id), events])
    if record.state is not None:
        state, values = record.state.state.to_bytes(), encode_values(record.state.values)
        out += packer.pack(["state", bytes(record.entity_id), state, values])
    return out


def _check_whole(record: EntityRecord, history: set[bytes]) -> None:
    """Raise InvalidArgument unless the entity's history so far is whole (durable dump)."""
    for event in record.events:
        if not event.event.is_genesis and not all(p in history for p in event.parent):
            break
        history.add(event.id)
    else:
        head = () if record.state is None else record.state.state.state.head
        if history and all(h in history for h in head):
            return
    raise InvalidArgument(
        f"entity {record.entity_id} holds a state or events without their history, as an "
        "ephemeral node's cache does: dump this store as ephemeral (mycelia dump --ephemeral)"
    )


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


def _kind(item: object) -> str:
    """The dump kind its header declares; raises DecodeError for a foreign header."""
    fields = expect_list(item, "dump header")
    if not fields or fields[0] != MAGIC:
        raise DecodeError("this is not a Mycelia dump (bad magic)")
    if fields[1:] == [1]:
        return DURABLE
    if len(fields) != 3 or fields[1] != FORMAT_VERSION:
        raise DecodeError(f"dump format {fields[1:2]!r} is not supported (1 or {FORMAT_VERSION})")
    kind = expect_str(fields[2], "dump kind")
    if kind not in (DURABLE, EPHEMERAL):
        raise DecodeError(f"unknown dump kind {kind!r} (durable or ephemeral)")
    return kind


class _Reader:
    """Turns dump items into verified, merged :class:`DumpRecord` values (module docstring)."""

    def __init__(
        self, engine: StorageEngine, kind: str, *, durable: bool, progress: Progress | None
    ) -> None:
        self.engine = engine
        self.kind = kind
        self.durable = durable
        self.progress = progress
        self.counts = DumpProgress()
        self.meta: dict[str, bytes] = {}
        self.rules: Rules | None = None
        self.check: EntityCheck | None = None
        self.root_seen = False
        self.ended = False

    async def records(self, items: AsyncIterator[object]) -> AsyncIterator[DumpRecord]:
        """Every record to load, in order; raises at the first bad item."""
        async for item in items:
            if self.ended:
                raise DecodeError("the dump continues after its trailer")
            fields = expect_list(item, "dump record")
            kind = expect_str(fields[0] if fields else None, "dump record kind")
            if kind == "meta":
                self.meta_record(fields)
                continue
            if self.rules is None:
                for record in await self.identity():
                    yield record
            if kind == "end":
                if (finished := await self.leave()) is not None:
                    yield finished
                self.trailer(fields)
            elif kind in ("events", "state"):
                if (
                    finished := await self.enter(fields[1] if len(fields) > 1 else None)
                ) is not None:
                    yield finished
                yield self.events(fields) if kind == "events" else self.state(fields)
            else:
                raise DecodeError(f"unknown dump record kind {kind!r}")
        if not self.ended:
            raise DecodeError("the dump is truncated (no trailer)")

    def meta_record(self, fields: list[object]) -> None:
        if self.rules is not None:
            raise DecodeError("a meta record comes after the dump's entities")
        _, raw_key, raw_value = expect_list(fields, "meta record", length=3)
        key, value = expect_str(raw_key, "meta key"), expect_bytes(raw_value, "meta value")
        if key in self.meta:
            raise DecodeError(f"the dump holds meta record {key!r} twice")
        check_meta(key, value)
        self.meta[key] = value

    async def identity(self) -> list[DumpRecord]:
        """Check the dump's system and node against the store's; the meta to write."""
        root = self.meta.get(SYSTEM_ROOT)
        self.rules = Rules(
            EntityId._trusted(root) if root is not None else None,
            ephemeral_dump=self.kind == EPHEMERAL,
            durable_target=self.durable,
        )
        if await _is_empty(self.engine):
            return [MetaRecord(k, v) for k, v in sorted(self.meta.items())]
        for key, error, what in (
            (SYSTEM_ROOT, ForeignSystem, "system root"),
            (NODE_KEY, ForeignNode, "node key"),
        ):
            ours, theirs = await self.engine.get_meta(key), self.meta.get(key)
            if ours != theirs:
                raise error(
                    f"the dump's {what} is not this store's: a dump loads into a store that "
                    "holds anything only if it is of the same node and system; load it "
                    "into an empty store"
                )
        self.root_seen = True  # the store already holds its own system
        extra = {k: v for k, v in self.meta.items() if await self.engine.get_meta(k) is None}
        return [MetaRecord(k, v) for k, v in sorted(extra.items())]

    async def enter(self, raw: object) -> EntityRecord | None:
        """Start the entity of the next record; returns the previous one's final record."""
        entity = EntityId._trusted(expect_bytes(raw, "entity id", length=ID_LENGTH))
        if self.check is not None and self.check.entity_id == entity:
            return None
        record = await self.leave()
        if self.counts._last is not None and entity <= EntityId._trusted(self.counts._last):
            raise DecodeError(f"entity {entity} is out of order (ids must increase)")
        assert self.rules is not None
        self.check = EntityCheck(entity, self.rules)
        self.counts.saw(entity, 0)
        return record

    async def leave(self) -> EntityRecord | None:
        """The finished entity's state record (recomputed and merged), if it writes one."""
        check, self.check = self.check, None
        if check is None:
            return None
        loaded = check.result()
        if self.rules is not None and check.entity_id == self.rules.root and check.replay:
            self.root_seen = True  # its genesis is in the dump (and bound no system)
        if self.progress is not None:
            self.progress(self.counts)
        if loaded is None:
            return None
        merged = await merge_with_stored(self.engine, check, loaded)
        return None if merged is None else EntityRecord(check.entity_id, (), merged)

    def events(self, fields: list[object]) -> EntityRecord:
        assert self.check is not None
        _, _, raw = expect_list(fields, "events record", length=3)
        admitted = []
        for item in expect_list(raw, "events"):
            generation, body = expect_list(item, "dumped event", length=2)
            event = Event.from_bytes(expect_bytes(body, "event bytes"), limits=STORED_LIMITS)
            claimed = expect_int(generation, "generation", minimum=1)
            admitted.append(self.check.add(claimed, event))
        self.counts.events += len(admitted)
        return EntityRecord(self.check.entity_id, tuple(admitted), None)

    def state(self, fields: list[object]) -> EntityRecord:
        assert self.check is not None
        _, _, raw_state, raw_values = expect_list(fields, "state record", length=4)
        try:
            state = EntityState.from_bytes(expect_bytes(raw_state, "state"), limits=STORED_LIMITS)
            values = decode_values(expect_bytes(raw_values, "values"))
        except MyceliaError as exc:
            raise InvalidState(
                f"the state of {self.check.entity_id} does not decode: {exc}"
            ) from exc
        self.check.state(StoredState(state, values))
        return EntityRecord(self.check.entity_id, (), None)

    def trailer(self, fields: list[object]) -> None:
        _, entities, events = expect_list(fields, "trailer", length=3)
        found = (expect_int(entities, "entities"), expect_int(events, "events"))
        if found != (self.counts.entities, self.counts.events):
            raise DecodeError("the dump's trailer does not match its content")
        if self.rules is not None and self.rules.root is not None and not self.root_seen:
            raise DecodeError(
                f"the dump names system root {self.rules.root} but does not hold its genesis"
            )
        self.ended = True


async def _is_empty(engine: StorageEngine) -> bool:
    """Whether ``engine`` holds nothing at all (no meta record, event or state)."""
    records = engine.dump()
    try:
        await anext(records)
    except StopAsyncIteration:
        return True
    finally:
        if isinstance(records, AsyncGenerator):
            await records.aclose()
    return False


async def load_from(
    fileobj: IO[bytes],
    engine: StorageEngine,
    progress: Progress | None = None,
    *,
    durable: bool = True,
) -> DumpProgress:
    """Load a dump from ``fileobj`` into ``engine``, all or nothing (module docstring).

    ``durable``: the store is a durable node's, so it takes no state without its history
    (pass False for a cache's store, to load an ephemeral dump). Returns the counts read.
    Raises DecodeError (IdMismatch, InvalidEvent, InvalidState) for a damaged, forged or
    truncated dump, ForeignSystem / ForeignNode for another node's dump into a store that
    is not empty, StorageError if the store was written meanwhile; nothing is loaded then.
    """
    items = _items(fileobj)
    try:
        kind = _kind(await anext(items))
    except StopAsyncIteration:
        raise DecodeError("the dump is empty") from None
    reader = _Reader(engine, kind, durable=durable, progress=progress)
    start = await engine.last_offset()
    try:
        await engine.load(reader.records(items), if_offset=start)
    except DecodeError as exc:  # the same class, with what to do
        raise type(exc)(
            f"{exc}; nothing was loaded: the dump is damaged or forged, so load a sound copy "
            "(or dump the source store again)"
        ) from exc
    if progress is not None:
        progress(reader.counts)
    return reader.counts
