"""Events: the content-hashed unit of change (ARCHITECTURE.md §3).

Invariants:

- An event's id is the SHA-256 of its canonical bytes, which :meth:`Event.to_bytes`
  returns. The id is computed here, from content, and nowhere else; it is never read from
  the wire. :meth:`Event.from_bytes` normalises what it decodes (sorted, de-duplicated
  parents; operations sorted by backend) and hashes the normalised form, so re-ordering a
  parent list can never mint a new id.
- Canonical bytes are a msgpack array with a domain tag first, and no maps:
  genesis ``[GENESIS_TAG, system | nil, collection, nonce, operations]`` and
  update ``[UPDATE_TAG, entity_id, collection, parent, operations]``, where ``operations``
  is ``[[backend, [diff, ...]], ...]`` sorted by backend name. The two tags make the
  shapes impossible to confuse.
- A genesis has an empty parent and its entity id *is* its own id; an update has 1 to
  ``max_parents`` parents. A genesis binds ``system`` (the root's entity id; ``None`` only
  for the root itself), ``collection``, a random ``nonce`` and its operations; an update
  binds ``entity_id``, ``collection``, ``parent`` and its operations. (Binding the
  collection of an update too is redundant with its entity id, and makes the canonical
  bytes the whole event, so an event needs no envelope to travel or be stored.)
- An :class:`AdmittedEvent` is an event plus its *generation* (1 for a genesis, else 1 +
  the largest generation of its parents), computed by the receiver on admission and never
  trusted from the wire (ARCHITECTURE.md §4).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Final, NamedTuple, NoReturn

import msgpack

from mycelia.errors import DecodeError, IdMismatch, InvalidArgument, InvalidEvent, PayloadTooLarge
from mycelia.proto.clock import EMPTY_CLOCK, Clock
from mycelia.proto.codec import (
    expect_bytes,
    expect_list,
    expect_name,
    pack,
    unpack,
    unpack_options,
    valid_names,
)
from mycelia.proto.ids import ID_LENGTH, EntityId, EventId, shared_entity_id, shared_event_id
from mycelia.proto.limits import DEFAULT_LIMITS, Limits

__all__ = [
    "GENESIS_TAG",
    "NONCE_LENGTH",
    "RESERVED_PREFIX",
    "SYSTEM_COLLECTION",
    "UPDATE_TAG",
    "AdmittedEvent",
    "Event",
    "Operations",
    "is_reserved_collection",
    "normalize_operations",
]

GENESIS_TAG: Final = "mycelia/genesis/1"
UPDATE_TAG: Final = "mycelia/update/1"
NONCE_LENGTH: Final = 16
RESERVED_PREFIX: Final = "_mycelia_"
SYSTEM_COLLECTION: Final = "_mycelia_system"

Operations = tuple[tuple[str, tuple[bytes, ...]], ...]
"""Per property backend (sorted by name), its diffs in order."""


_ONLY_CONSTRUCTORS: Final = "build an Event with Event.genesis, Event.update or Event.from_bytes"


def _check_name(name: object, what: str, limits: Limits) -> str:
    # Names repeat endlessly (a few collections, two backends); the ones that passed are
    # remembered (per limits, bounded: see valid_names), which keeps validation off the
    # decode hot path.
    if type(name) is str and name in valid_names(limits):
        return name
    return expect_name(name, what, limits=limits)


def is_reserved_collection(collection: str) -> bool:
    """Whether ``collection`` is reserved for Mycelia itself (no client may write it)."""
    return collection.startswith(RESERVED_PREFIX)


def normalize_operations(
    operations: Mapping[str, Sequence[bytes]] | Iterable[tuple[str, Sequence[bytes]]],
) -> Operations:
    """Sort by backend, concatenate repeated backends in order, drop backends with no diffs."""
    if isinstance(operations, dict):  # the common case: names are unique already
        return tuple([(n, tuple(d)) for n, d in sorted(operations.items()) if d])
    items = operations.items() if isinstance(operations, Mapping) else operations
    merged: dict[str, list[bytes]] = {}
    for backend, diffs in items:
        merged.setdefault(backend, []).extend(diffs)
    return tuple((name, tuple(merged[name])) for name in sorted(merged) if merged[name])


def _check_operations(operations: Operations, limits: Limits) -> None:
    total = 0
    for name, diffs in operations:
        _check_name(name, "backend name", limits)
        for diff in diffs:
            if not isinstance(diff, bytes):
                raise InvalidEvent(f"a diff of backend {name!r} is not bytes")
            total += len(diff)
    if total > limits.max_operation_bytes:
        raise PayloadTooLarge(
            f"this transaction's changes to one entity are {total:,} bytes, and one event "
            f"holds at most {limits.max_operation_bytes:,}: make the change in several "
            "transactions (a long text inserted in pieces)"
        )


class _EventFields(NamedTuple):
    """The fields of an :class:`Event`, in canonical order (a tuple underneath)."""

    id: EventId
    """The SHA-256 of :meth:`Event.to_bytes`."""
    entity_id: EntityId
    """The entity this event changes (for a genesis, its own id)."""
    collection: str
    """The collection the entity lives in."""
    parent: Clock
    """The head this event was made on; empty exactly for a genesis."""
    operations: Operations
    """Per backend, its diffs (opaque to this layer)."""
    system: EntityId | None
    """A genesis's system root (``None`` for the root itself and for updates)."""
    nonce: bytes | None
    """A genesis's random nonce (``None`` for updates)."""
    canonical: bytes
    """The canonical bytes; :meth:`Event.to_bytes` returns them."""


class Event(_EventFields):
    """One change to one entity. Build with :meth:`genesis`, :meth:`update`, :meth:`from_bytes`.

    An immutable tuple underneath (construction and attribute access are the decode hot
    path: a tuple costs a third of a frozen dataclass); equality and hashing are by id.
    Those three constructors are the only way in: ``Event(...)``, ``_make`` and
    ``_replace`` raise TypeError, and a copy or a pickle goes through :meth:`from_bytes`,
    so an event whose id does not match its content cannot exist. (This module assembles
    events with :func:`_assemble`, only from fields it has just validated and hashed.)
    """

    __slots__ = ()

    def __new__(cls, *args: object, **kwargs: object) -> Event:
        """Refused: an event's id must be computed from its content (see the class)."""
        raise TypeError(_ONLY_CONSTRUCTORS)

    @classmethod
    def _make(cls, iterable: Iterable[object]) -> Event:  # type: ignore[override]  # refuses
        raise TypeError(_ONLY_CONSTRUCTORS)

    def _replace(self, **kwargs: object) -> NoReturn:
        raise TypeError(_ONLY_CONSTRUCTORS)

    def __reduce__(self) -> tuple[Callable[[bytes], Event], tuple[bytes]]:
        # copy, deepcopy and pickle rebuild from the canonical bytes, re-hashing them.
        return (Event.from_bytes, (self.canonical,))

    @classmethod
    def genesis(
        cls,
        *,
        collection: str,
        system: EntityId | None,
        operations: Mapping[str, Sequence[bytes]] | Iterable[tuple[str, Sequence[bytes]]] = (),
        nonce: bytes,
        limits: Limits = DEFAULT_LIMITS,
    ) -> Event:
        """A new genesis; its id (and the entity's) derives from the content and ``nonce``.

        ``nonce`` (:data:`NONCE_LENGTH` bytes) comes from the caller's entropy — a node's
        injected ``rng`` or the OS (this layer reads none, STYLE.md §3) — so identical
        payloads make two entities. Raises InvalidArgument for a bad collection name,
        nonce or oversized operations.
        """
        ops = normalize_operations(operations)
        try:
            _check_name(collection, "collection", limits)
            if len(nonce) != NONCE_LENGTH:
                raise InvalidEvent(f"a genesis nonce is {NONCE_LENGTH} bytes, got {len(nonce)}")
            _check_operations(ops, limits)
        except DecodeError as exc:
            raise InvalidArgument(str(exc)) from exc
        return _finish_genesis(system, collection, nonce, ops)

    @classmethod
    def update(
        cls,
        *,
        entity_id: EntityId,
        collection: str,
        parent: Clock,
        operations: Mapping[str, Sequence[bytes]] | Iterable[tuple[str, Sequence[bytes]]],
        limits: Limits = DEFAULT_LIMITS,
    ) -> Event:
        """A new update of ``entity_id`` made on the head ``parent`` (must not be empty).

        Raises InvalidArgument for an empty or too wide parent, a bad collection name or
        oversized operations.
        """
        ops = normalize_operations(operations)
        try:
            _check_name(collection, "collection", limits)
            _check_parent(parent, limits)
            _check_operations(ops, limits)
        except DecodeError as exc:
            raise InvalidArgument(str(exc)) from exc
        return _finish_update(entity_id, collection, parent, ops)

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        *,
        limits: Limits = DEFAULT_LIMITS,
        expect_id: EventId | None = None,
    ) -> Event:
        """Decode and validate an event; its id is recomputed from the content.

        Non-canonical input (unsorted parents, repeated backends, wide integer forms) is
        normalised first, so it yields exactly the event its canonical form would.

        Raises:
            DecodeError: the bytes are not an event (``PayloadTooLarge`` beyond a limit,
                ``InvalidEvent`` for a bad shape, ``IdMismatch`` if ``expect_id`` differs).
        """
        # The common case skips the unpack() wrapper; anything unusual goes through it for
        # its size check and typed errors.
        if type(data) is bytes and len(data) <= limits.max_frame_bytes:
            try:
                fields = _unpackb(data, **unpack_options(limits))
            except Exception:  # noqa: BLE001 - re-decoded below for the typed error
                fields = unpack(data, limits=limits, what="event")
        else:
            fields = unpack(data, limits=limits, what="event")
        event = None
        if type(fields) is list and len(fields) == 5 and fields[0] == UPDATE_TAG:
            event = _decode_canonical_update(fields, data, limits)
        if event is None:
            event = _decode_general(fields, data, limits)
        if expect_id is not None and event.id != expect_id:
            raise IdMismatch(f"event content hashes to {event.id}, not the claimed {expect_id}")
        return event

    @property
    def is_genesis(self) -> bool:
        """Whether this event creates its entity."""
        return not self.parent

    def to_bytes(self) -> bytes:
        """The canonical bytes (the id is their SHA-256)."""
        return self.canonical

    def diffs(self, backend: str) -> tuple[bytes, ...]:
        """The diffs this event carries for ``backend`` (empty if none)."""
        for name, diffs in self.operations:
            if name == backend:
                return diffs
        return ()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Event):
            return self.id == other.id
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        if isinstance(other, Event):
            return self.id != other.id
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        kind = "genesis" if self.is_genesis else f"update parent={self.parent!r}"
        return f"Event({self.id!r} {self.collection}/{self.entity_id!r} {kind})"


def _decode_general(fields: object, data: bytes, limits: Limits) -> Event:
    """Decode any event shape, normalising what is not canonical; raises DecodeError."""
    tag, first, collection, third, raw_ops = expect_list(fields, "event", length=5)
    name = _check_name(collection, "event collection", limits)
    ops, _ = _decode_operations(raw_ops, limits)
    if tag == UPDATE_TAG:
        entity = shared_entity_id(expect_bytes(first, "entity_id", length=ID_LENGTH))
        parent, _ = _decode_parent(third, limits)
        return _finish_update(entity, name, parent, ops)
    if tag == GENESIS_TAG:
        system = None if first is None else expect_bytes(first, "genesis system", length=32)
        nonce = expect_bytes(third, "genesis nonce", length=NONCE_LENGTH)
        system_id = None if system is None else _new_entity_id(EntityId, system)
        return _finish_genesis(system_id, name, nonce, ops)
    raise InvalidEvent(f"unknown event tag {tag!r}")


def _decode_canonical_update(fields: list[object], data: bytes, limits: Limits) -> Event | None:
    """The hot path in one flat function: an update that arrived in canonical form.

    Returns ``None`` for anything else (including anything invalid), and the caller takes
    :func:`_decode_general`, which decides. For canonical input both give the same event
    (a property test holds them to it); this one only skips the normalising work.
    """
    _, entity, collection, parents, raw_ops = fields
    names = valid_names(limits)
    if (
        type(entity) is not bytes
        or len(entity) != ID_LENGTH
        or type(collection) is not str
        or collection not in names
        or type(parents) is not list
        or not 0 < len(parents) <= limits.max_parents
        or type(raw_ops) is not list
        or len(raw_ops) > limits.max_array_length
    ):
        return None
    ids = []
    previous = b""
    for p in parents:
        if type(p) is not bytes or len(p) != ID_LENGTH or p <= previous:
            return None
        ids.append(shared_event_id(p))
        previous = p
    ops = []
    previous_name = ""
    total = 0
    for item in raw_ops:
        if type(item) is not list or len(item) != 2:
            return None
        name, diffs = item
        if (
            type(name) is not str
            or name <= previous_name
            or name not in names
            or type(diffs) is not list
            or not 0 < len(diffs) <= limits.max_array_length
        ):
            return None
        for d in diffs:
            if type(d) is not bytes:
                return None
            total += len(d)
        ops.append((name, tuple(diffs)))
        previous_name = name
    if total > limits.max_operation_bytes or pack(fields) != data:
        return None
    event_id = shared_event_id(_sha256(data).digest())
    parent = Clock.single(ids[0]) if len(ids) == 1 else Clock._of_sorted(tuple(ids))
    ops_t = tuple(ops)
    entity_id = shared_entity_id(entity)
    return _assemble(Event, (event_id, entity_id, collection, parent, ops_t, None, None, data))


_unpackb = msgpack.unpackb
_assemble = tuple.__new__
"""The trusted constructor: fields this module has validated, with the id it hashed."""
_new_entity_id = bytes.__new__
_sha256 = hashlib.sha256


def _check_parent(parent: Clock, limits: Limits) -> None:
    if not parent:
        raise InvalidEvent("an update needs at least one parent (only a genesis has none)")
    if len(parent) > limits.max_parents:
        raise PayloadTooLarge(
            f"an event names {len(parent)} parents; the limit is {limits.max_parents}"
        )


def _finish_genesis(
    system: EntityId | None, collection: str, nonce: bytes, ops: Operations
) -> Event:
    # Callers have validated every field; this only hashes and assembles. (msgpack packs
    # tuples as arrays, so the operations and the clock go in as they are.)
    raw = pack((GENESIS_TAG, system, collection, nonce, ops))
    event_id = shared_event_id(_sha256(raw).digest())
    entity = _new_entity_id(EntityId, event_id)
    return _assemble(Event, (event_id, entity, collection, EMPTY_CLOCK, ops, system, nonce, raw))


def _finish_update(entity_id: EntityId, collection: str, parent: Clock, ops: Operations) -> Event:
    # Callers have validated every field; this only hashes and assembles.
    raw = pack((UPDATE_TAG, entity_id, collection, parent.ids, ops))
    event_id = shared_event_id(_sha256(raw).digest())
    return _assemble(Event, (event_id, entity_id, collection, parent, ops, None, None, raw))


def _decode_parent(raw: object, limits: Limits) -> tuple[Clock, bool]:
    """The parent clock and whether it arrived in canonical (strictly increasing) order."""
    parents = expect_list(raw, "update parent", max_len=limits.max_parents)
    if not parents:
        raise InvalidEvent("an update needs at least one parent (only a genesis has none)")
    ids = [shared_event_id(expect_bytes(p, "parent id", length=ID_LENGTH)) for p in parents]
    if len(ids) == 1:
        return Clock.single(ids[0]), True
    if all(a < b for a, b in pairwise(ids)):
        return Clock._of_sorted(tuple(ids)), True
    # Anything but the canonical order is normalised (and so hashes as the canonical
    # event would), never trusted as sent.
    return Clock(ids), False


def _decode_operations(raw: object, limits: Limits) -> tuple[Operations, bool]:
    """The operations and whether they arrived canonical (sorted, unique, non-empty)."""
    items = expect_list(raw, "operations", max_len=limits.max_array_length)
    ops: list[tuple[str, tuple[bytes, ...]]] = []
    canonical = True
    previous = ""
    total = 0
    for item in items:
        pair = expect_list(item, "operation", length=2)
        name = _check_name(pair[0], "backend name", limits)
        diffs = expect_list(pair[1], f"operations[{name}]", max_len=limits.max_array_length)
        for d in diffs:
            total += len(expect_bytes(d, f"diff of {name}"))
        canonical = canonical and bool(diffs) and name > previous
        previous = name
        ops.append((name, tuple(diffs)))  # type: ignore[arg-type]  # each checked above
    if total > limits.max_operation_bytes:
        raise PayloadTooLarge(
            f"event operations are {total} bytes; the limit is {limits.max_operation_bytes}"
        )
    return (tuple(ops), True) if canonical else (normalize_operations(ops), False)


@dataclass(frozen=True, slots=True)
class AdmittedEvent:
    """An event as a node holds it: the event plus its locally computed generation."""

    event: Event
    generation: int
    """1 for a genesis, else 1 + the largest generation among its parents."""

    @property
    def id(self) -> EventId:
        """The event's id."""
        return self.event.id

    @property
    def parent(self) -> Clock:
        """The event's parent clock."""
        return self.event.parent

    @property
    def entity_id(self) -> EntityId:
        """The entity the event changes."""
        return self.event.entity_id

    @property
    def collection(self) -> str:
        """The entity's collection."""
        return self.event.collection

    def to_bytes(self) -> bytes:
        """The event's canonical bytes (the generation is local and is not included)."""
        return self.event.to_bytes()
