"""Declarative wire schemas: each field of a wire value names its codec, once.

A wire value (a message, or a record nested in one) is a frozen dataclass whose fields are
declared with :func:`wire`::

    @record
    class KnownEntity(Record):
        entity_id: EntityId = wire(ENTITY_ID)
        head: tuple[EventId, ...] = wire(Array(EVENT_ID, limit="max_clock_width"))

and that declaration is the whole schema: :meth:`Record.to_wire` and
:meth:`Record.from_wire` are derived from it, so a field's type, its limit and its
position on the wire are written in one place (mypy checks that a field's codec yields
the field's type).

Invariants:

- The wire form is the positional array of the fields' encodings in declaration order,
  with no field names and no maps, so it is deterministic (``proto.codec``).
- Decoding never builds a half-checked value: every field is decoded (typed, bounded by a
  documented limit or a :class:`~mycelia.proto.limits.Limits` attribute) before the
  class is constructed, and :meth:`Record.check_decoded` then judges what spans fields.
  Anything wrong is a :class:`~mycelia.errors.DecodeError`.
- A *plain* codec's values are their own wire form (msgpack packs ids, strings, numbers
  and tuples of them as they are), so encoding skips them. :func:`record` writes each
  class's ``to_wire`` / ``from_wire`` out from its schema once (as :mod:`dataclasses`
  writes ``__init__``), so the declared codec costs what the hand-written one did.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import (
    Any,
    ClassVar,
    Final,
    Generic,
    Protocol,
    Self,
    TypeVar,
    cast,
    dataclass_transform,
    overload,
)

from mycelia.errors import DecodeError, InvalidArgument, PayloadTooLarge
from mycelia.proto.codec import expect_bytes, expect_int, expect_list, expect_name, expect_str
from mycelia.proto.event import Event
from mycelia.proto.ids import (
    ID_LENGTH,
    EntityId,
    EventId,
    NodeId,
    shared_entity_id,
    shared_event_id,
)
from mycelia.proto.limits import Limits
from mycelia.proto.state import EntityState

__all__ = [
    "BOOL",
    "COMMITS",
    "ENTITY_ID",
    "EVENTS",
    "EVENT_ID",
    "NAME",
    "NODE_ID",
    "STATE",
    "Array",
    "Bytes",
    "Codec",
    "Int",
    "Nested",
    "Optional",
    "Record",
    "Str",
    "Values",
    "record",
    "wire",
]

T = TypeVar("T")
R = TypeVar("R", bound="Record")
I = TypeVar("I", EntityId, EventId, NodeId)  # noqa: E741 - the id kinds

_WIRE: Final = "mycelia.wire"


class Codec(Protocol[T]):
    """How one field travels: its wire form, and the checked decoding of that form."""

    @property
    def plain(self) -> bool:
        """Whether a value is its own wire form (then :meth:`encode` is never called)."""
        ...

    def encode(self, value: T) -> object:
        """The wire form of ``value`` (msgpack-ready, positional)."""
        ...

    def decode(self, obj: object, what: str, limits: Limits) -> T:
        """``obj`` as the field's type; raises DecodeError naming ``what``."""
        ...


class _Plain:
    """A codec whose values msgpack packs as they are."""

    __slots__ = ()
    plain: Final = True

    def encode(self, value: object) -> object:
        return value


@dataclass(frozen=True, slots=True)
class Int(_Plain):
    """An integer of at least ``minimum``; ``clamp`` names a Limits attribute it is cut to."""

    minimum: int = 0
    clamp: str | None = None

    def decode(self, obj: object, what: str, limits: Limits) -> int:
        value = expect_int(obj, what, minimum=self.minimum)
        return value if self.clamp is None else min(value, getattr(limits, self.clamp))


@dataclass(frozen=True, slots=True)
class _Bool(_Plain):
    def decode(self, obj: object, what: str, limits: Limits) -> bool:
        if not isinstance(obj, bool):
            expect_int(obj, what)  # an integer is taken for its truth; anything else refused
        return bool(obj)


@dataclass(frozen=True, slots=True)
class Bytes(_Plain):
    """Bytes of exactly ``length``, or of at most ``max_len`` (PayloadTooLarge beyond)."""

    length: int | None = None
    max_len: int | None = None

    def decode(self, obj: object, what: str, limits: Limits) -> bytes:
        value = expect_bytes(obj, what, length=self.length)
        if self.max_len is not None and len(value) > self.max_len:
            raise PayloadTooLarge(f"{what} is at most {self.max_len} bytes")
        return value


@dataclass(frozen=True, slots=True)
class Str(_Plain):
    """A string of at most ``max_len`` characters."""

    max_len: int

    def decode(self, obj: object, what: str, limits: Limits) -> str:
        return expect_str(obj, what, max_len=self.max_len)


@dataclass(frozen=True, slots=True)
class _Name(_Plain):
    def decode(self, obj: object, what: str, limits: Limits) -> str:
        return expect_name(obj, what, limits=limits)


@dataclass(frozen=True, slots=True)
class _Id(_Plain, Generic[I]):
    """An id, made by ``make`` from 32 checked bytes: the shared object of an entity or
    event id (:func:`~mycelia.proto.ids.shared_entity_id`), so that a subscriber's decoded
    deltas and clocks hold no copies of their own for the garbage collector to promote and
    walk; a new one of other kinds."""

    make: Callable[[bytes], I]

    def decode(self, obj: object, what: str, limits: Limits) -> I:
        if type(obj) is not bytes or len(obj) != ID_LENGTH:
            obj = expect_bytes(obj, what, length=ID_LENGTH)  # raises but for a bytes subclass
        return self.make(obj)

    def decode_all(self, items: list[object], what: str) -> tuple[I, ...]:
        """Many ids at once (the hot path of clocks and id lists)."""
        for item in items:
            if type(item) is not bytes or len(item) != ID_LENGTH:
                expect_bytes(item, what, length=ID_LENGTH)  # raises but for a bytes subclass
        make = self.make
        return tuple([make(item) for item in items])  # type: ignore[arg-type]  # checked


@dataclass(frozen=True, slots=True)
class Values(_Plain):
    """A tuple of plain msgpack values (query arguments), at most ``max_len``."""

    max_len: int

    def decode(self, obj: object, what: str, limits: Limits) -> tuple[object, ...]:
        return tuple(expect_list(obj, what, max_len=self.max_len))


@dataclass(frozen=True, slots=True)
class Optional(Generic[T]):
    """``None``, or a value of ``inner``."""

    inner: Codec[T]

    @property
    def plain(self) -> bool:
        return self.inner.plain

    def encode(self, value: T | None) -> object:
        return None if value is None else self.inner.encode(value)

    def decode(self, obj: object, what: str, limits: Limits) -> T | None:
        return None if obj is None else self.inner.decode(obj, what, limits)


@dataclass(frozen=True, slots=True)
class Array(Generic[T]):
    """A tuple of ``item`` values, at most ``limit`` of them (a Limits attribute)."""

    item: Codec[T]
    limit: str

    @property
    def plain(self) -> bool:
        return self.item.plain  # msgpack packs a tuple as the array it is

    def encode(self, value: tuple[T, ...]) -> object:
        encode = self.item.encode
        return [encode(v) for v in value]

    def decode(self, obj: object, what: str, limits: Limits) -> tuple[T, ...]:
        items = expect_list(obj, what, max_len=getattr(limits, self.limit))
        item = self.item
        if isinstance(item, _Id):  # T is the id kind
            return item.decode_all(items, what)
        decode = item.decode
        return tuple([decode(i, what, limits) for i in items])


@dataclass(frozen=True, slots=True)
class _Events:
    plain: ClassVar[bool] = False

    def encode(self, value: tuple[Event, ...]) -> object:
        return [e.to_bytes() for e in value]

    def decode(self, obj: object, what: str, limits: Limits) -> tuple[Event, ...]:
        items = expect_list(obj, what, max_len=limits.max_batch_events)
        out = []
        for item in items:  # each one re-hashed: ids are never read from the wire
            if not isinstance(item, bytes):
                raise DecodeError(f"{what} items must be bytes, got {type(item).__name__}")
            out.append(Event.from_bytes(item, limits=limits))
        return tuple(out)


@dataclass(frozen=True, slots=True)
class _Commits:
    plain: ClassVar[bool] = False

    def encode(self, value: tuple[tuple[Event, ...], ...]) -> object:
        return [[e.to_bytes() for e in commit] for commit in value]

    def decode(self, obj: object, what: str, limits: Limits) -> tuple[tuple[Event, ...], ...]:
        commits = expect_list(obj, what, max_len=limits.max_batch_commits)
        if not commits:
            raise DecodeError(f"{what} holds no commit")
        total = 0
        for commit in commits:  # every bound checked before any event is decoded (hashed)
            events = expect_list(commit, what, max_len=limits.max_batch_events)
            if not events:
                raise DecodeError(f"a commit of {what} has no events")
            total += len(events)
        if total > limits.max_batch_events:
            raise PayloadTooLarge(
                f"{what} holds {total} events in all, at most {limits.max_batch_events}"
            )
        return tuple([EVENTS.decode(commit, what, limits) for commit in commits])


@dataclass(frozen=True, slots=True)
class _State:
    plain: ClassVar[bool] = False

    def encode(self, value: EntityState) -> object:
        return value.to_wire()

    def decode(self, obj: object, what: str, limits: Limits) -> EntityState:
        return EntityState.from_wire(obj, limits=limits)


@dataclass(frozen=True, slots=True)
class Nested(Generic[R]):
    """A record of class ``kind`` (its own schema), nested in its wire array."""

    kind: type[R]
    plain: ClassVar[bool] = False

    def encode(self, value: R) -> object:
        return value.to_wire()

    def decode(self, obj: object, what: str, limits: Limits) -> R:
        return self.kind.from_wire(obj, limits)


BOOL: Final = _Bool()
"""A boolean (an integer is taken for its truth, as msgpack peers may send one)."""
NAME: Final = _Name()
"""A collection name (``proto.codec.NAME_PATTERN``, at most ``max_name_length``)."""
ENTITY_ID: Final = _Id(shared_entity_id)
EVENT_ID: Final = _Id(shared_event_id)
NODE_ID: Final = _Id(NodeId._trusted)
EVENTS: Final = _Events()
"""Events as their canonical bytes, each re-hashed on decode (at most ``max_batch_events``)."""
COMMITS: Final = _Commits()
"""Commits, each a non-empty run of events (as :data:`EVENTS`): at least one, at most
``max_batch_commits`` of them, and at most ``max_batch_events`` events in all."""
STATE: Final = _State()
"""An :class:`~mycelia.proto.EntityState` in its wire form."""
CLOCK: Final = Array(EVENT_ID, limit="max_clock_width")
"""A head or a base: event ids, at most a clock's width."""


@overload
def wire(codec: Codec[T]) -> T: ...
@overload
def wire(codec: Codec[T], *, default: T) -> T: ...
def wire(codec: Codec[Any], *, default: object = dataclasses.MISSING) -> Any:
    """Declare a field of a :class:`Record` and how it travels (see the module docstring)."""
    return dataclasses.field(default=default, metadata={_WIRE: codec})


class Record:
    """A frozen value with a declared wire schema; subclasses are built with :func:`record`,
    which compiles :meth:`to_wire` and :meth:`from_wire` from the schema."""

    __slots__ = ()
    SCHEMA: ClassVar[tuple[tuple[str, Codec[Any]], ...]] = ()
    """``(field name, codec)`` in wire order, collected from the :func:`wire` declarations."""

    def to_wire(self) -> list[object]:
        """The fields' wire forms, positionally."""
        raise NotImplementedError  # pragma: no cover - replaced by record()

    @classmethod
    def from_wire(cls, obj: object, limits: Limits) -> Self:
        """Decode :meth:`to_wire`; raises DecodeError on any bad field."""
        raise NotImplementedError  # pragma: no cover - replaced by record()

    def check_decoded(self) -> None:
        """Judge what spans fields, once all are decoded; raises DecodeError (none here)."""


@dataclass_transform(frozen_default=True, field_specifiers=(wire,))
def record(cls: type[R]) -> type[R]:
    """Make ``cls`` a frozen, slotted dataclass whose :func:`wire` fields are its schema.

    Raises InvalidArgument if a field is declared without :func:`wire`.
    """
    built = dataclass(frozen=True, slots=True)(cls)
    schema = []
    for f in dataclasses.fields(cast("Any", built)):
        codec = f.metadata.get(_WIRE)
        if codec is None:
            raise InvalidArgument(f"{cls.__name__}.{f.name} is not declared with wire()")
        schema.append((f.name, codec))
    built.SCHEMA = tuple(schema)
    to_wire, from_wire = _compile(built)
    type.__setattr__(built, "to_wire", to_wire)
    type.__setattr__(built, "from_wire", classmethod(from_wire))
    return built


def _compile(cls: type[R]) -> tuple[Callable[..., list[object]], Callable[..., R]]:
    """``to_wire`` and ``from_wire`` for ``cls``, generated from its schema.

    The functions are written out as source and compiled once per class, the way
    :mod:`dataclasses` writes ``__init__``: a generic loop over the schema costs about half
    as much again per record on the decode path, and frames carry many records. Only
    field names (identifiers, checked by ``dataclass``) and repr'd strings reach the source.
    """
    name, schema = cls.__name__, cls.SCHEMA
    scope: dict[str, object] = {"_expect_list": expect_list}
    reads, encoded, decoded = [], [], []
    for i, (field, codec) in enumerate(schema):
        if not field.isidentifier():  # pragma: no cover - dataclass refuses such names
            raise InvalidArgument(f"{name}.{field} is not an identifier")
        scope[f"_e{i}"], scope[f"_d{i}"] = codec.encode, codec.decode
        reads.append(f"f{i}")
        encoded.append(f"self.{field}" if codec.plain else f"_e{i}(self.{field})")
        decoded.append(f"_d{i}(f{i}, {f'{name}.{field}'!r}, limits)")
    check = "" if cls.check_decoded is Record.check_decoded else "    value.check_decoded()\n"
    source = (
        f"def to_wire(self):\n    return [{', '.join(encoded)}]\n"
        f"def from_wire(cls, obj, limits):\n"
        f"    ({', '.join(reads)},) = _expect_list(obj, {name!r}, length={len(schema)})\n"
        f"    value = cls({', '.join(decoded)})\n{check}    return value\n"
    )
    exec(compile(source, f"<wire schema of {name}>", "exec"), scope)  # noqa: S102 - see above
    to_wire = cast("Callable[..., list[object]]", scope["to_wire"])
    return to_wire, cast("Callable[..., R]", scope["from_wire"])
