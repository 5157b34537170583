"""Entity state snapshots and attestations (ARCHITECTURE.md §3).

Invariants:

- :class:`State` holds one state buffer per property backend (sorted by backend name), the
  head clock, and the generation of every head event (aligned with ``head.ids``), which is
  what an applier needs to place new events on a snapshot whose events it does not hold.
- Encodings are positional msgpack arrays, canonical like events, so two replicas with the
  same state produce the same bytes.
- :class:`Attested` wraps a payload with attestations (opaque signatures judged by the
  policy agent); attestations are outside every hash.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

from mycelia.errors import DecodeError, InvalidArgument
from mycelia.proto.clock import EMPTY_CLOCK, Clock
from mycelia.proto.codec import (
    expect_bytes,
    expect_int,
    expect_list,
    expect_name,
    pack,
    unpack,
    valid_names,
)
from mycelia.proto.ids import ID_LENGTH, EntityId, EventId, shared_event_id
from mycelia.proto.limits import DEFAULT_LIMITS, Limits

__all__ = ["Attested", "Buffer", "Deferred", "EntityState", "Merge", "State", "plain_entity_state"]

T = TypeVar("T")

MAX_BUFFERS: Final = 64
"""Most backend buffers one state may hold."""


class Deferred:
    """A state buffer computed when first read, then kept (ARCHITECTURE.md §5: a text
    state is canonicalised lazily). ``make`` must be a pure function of what it captured.

    ``estimate``, when given, is about the buffer's size, for a cheap size check that need
    not compute it (:meth:`EntityState.wire_size` with ``estimate=True``): the bytes of
    the parts ``make`` merges, which a merge's re-encoding exceeds by a few dozen bytes at
    most.

    ``parts``, when given, are what ``make`` merges: a base (``b""`` for none) and the
    updates since, which a durable engine stores instead of computing the buffer
    (:meth:`EntityState.to_stored`), and a reader can rebuild the backend from. They may
    be given as a pure function that returns them, called when they are first read: a
    text's log holds up to a thousand updates, and only a durable engine reads them (an
    editor's ephemeral client copied the whole log at every keystroke)."""

    __slots__ = ("_make", "_parts", "_value", "estimate")

    def __init__(
        self,
        make: Callable[[], bytes],
        *,
        estimate: int | None = None,
        parts: tuple[bytes, ...] | Callable[[], tuple[bytes, ...]] | None = None,
    ) -> None:
        self._make: Callable[[], bytes] | None = make
        self._value = b""
        self.estimate = estimate
        self._parts = parts

    @property
    def parts(self) -> tuple[bytes, ...] | None:
        """What ``make`` merges, if known (computed on the first read if given as a
        function)."""
        parts = self._parts
        if callable(parts):
            parts = self._parts = parts()
        return parts

    def get(self) -> bytes:
        """The buffer (computed on the first call)."""
        make = self._make
        if make is not None:
            self._value = make()
            self._make = None
        return self._value

    @property
    def ready(self) -> bool:
        """Whether the buffer has been computed."""
        return self._make is None


Buffer = bytes | Deferred
"""A backend's state buffer, or one computed when first read."""


class State:
    """One entity's materialised state: backend buffers, head, head generations.

    Immutable. A buffer may be given as a :class:`Deferred`: it is computed the first time
    :attr:`buffers` is read (equality and hashing read it), so a state that nobody reads
    (an in-memory store's, replaced by the next write) never pays for it.
    """

    __slots__ = ("_buffers", "_parts", "generations", "head")

    head: Clock
    generations: tuple[int, ...]
    """The generation of each id in ``head`` (same order as ``head.ids``)."""
    _buffers: tuple[tuple[str, bytes], ...] | None
    _parts: tuple[tuple[str, Buffer], ...] | None

    def __init__(
        self,
        head: Clock,
        generations: tuple[int, ...],
        buffers: tuple[tuple[str, Buffer], ...],
    ) -> None:
        if len(generations) != len(head):
            raise InvalidArgument("a state needs one generation per head id")
        setattr_ = object.__setattr__
        setattr_(self, "head", head)
        setattr_(self, "generations", generations)
        lazy = False
        for _, buf in buffers:  # (a loop: a generator costs more than one buffer's check)
            if type(buf) is Deferred:
                lazy = True
                break
        setattr_(self, "_parts", buffers if lazy else None)
        setattr_(self, "_buffers", None if lazy else buffers)

    @classmethod
    def _of_bytes(
        cls, head: Clock, generations: tuple[int, ...], buffers: tuple[tuple[str, bytes], ...]
    ) -> State:
        # For decoders that have just checked the shape (one generation per id, byte
        # buffers sorted by name): skips the checks of __init__.
        state = cls.__new__(cls)
        setattr_ = object.__setattr__
        setattr_(state, "head", head)
        setattr_(state, "generations", generations)
        setattr_(state, "_parts", None)
        setattr_(state, "_buffers", buffers)
        return state

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"State is immutable (cannot set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"State is immutable (cannot delete {name!r})")

    @property
    def buffers(self) -> tuple[tuple[str, bytes], ...]:
        """Per backend (sorted by name), its state buffer."""
        buffers = self._buffers
        if buffers is None:
            parts = self._parts or ()
            buffers = tuple((name, b.get() if isinstance(b, Deferred) else b) for name, b in parts)
            object.__setattr__(self, "_buffers", buffers)
            object.__setattr__(self, "_parts", None)
        return buffers

    def lazy_buffers(self) -> tuple[tuple[str, Buffer], ...]:
        """Per backend (sorted by name), its buffer as given: bytes, or a
        :class:`Deferred` not computed yet (computing none)."""
        return self._buffers or self._parts or ()

    def backend_names(self) -> tuple[str, ...]:
        """The backends' names, sorted (computing no buffer)."""
        parts: tuple[tuple[str, Buffer], ...] = self._buffers or self._parts or ()
        return tuple([name for name, _ in parts])

    def buffer_bytes(self, *, estimate: bool = False) -> int:
        """The bytes of the buffers; with ``estimate``, a buffer not computed yet counts its
        :attr:`Deferred.estimate` instead of being computed (when it has one)."""
        parts = self._parts
        if not estimate or parts is None:
            return sum([len(buf) for _, buf in self.buffers])
        total = 0
        for _, part in parts:
            if not isinstance(part, Deferred):
                total += len(part)
            elif part.ready or part.estimate is None:
                total += len(part.get())
            else:
                total += part.estimate
        return total

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, State):
            return NotImplemented
        return (
            self.head == other.head
            and self.generations == other.generations
            and self.buffers == other.buffers
        )

    def __hash__(self) -> int:
        return hash((self.head, self.generations, self.buffers))

    def __repr__(self) -> str:
        return (
            f"State(head={self.head!r}, generations={self.generations!r}, buffers={self.buffers!r})"
        )

    @classmethod
    def empty(cls) -> State:
        """The state of an entity that does not exist yet."""
        return cls(EMPTY_CLOCK, (), ())

    @classmethod
    def of(cls, *, head: Mapping[EventId, int], buffers: Mapping[str, Buffer]) -> State:
        """A state from a head (id → generation) and buffers (backend → bytes, or a
        :class:`Deferred`)."""
        clock = Clock(head)
        return cls(
            clock,
            tuple(head[i] for i in clock),
            tuple((name, buffers[name]) for name in sorted(buffers)),
        )

    def head_generations(self) -> dict[EventId, int]:
        """The head as a mapping id → generation."""
        return dict(zip(self.head.ids, self.generations, strict=True))

    def buffer(self, backend: str) -> bytes | None:
        """The buffer of ``backend``, if the state has one."""
        for name, buf in self.buffers:
            if name == backend:
                return buf
        return None

    def to_wire(self) -> list[object]:
        """The positional form used inside messages and :class:`EntityState`."""
        return [list(self.head.ids), list(self.generations), [list(b) for b in self.buffers]]

    def to_stored(self) -> list[object]:
        """:meth:`to_wire`, except that a buffer not computed yet whose :class:`Deferred`
        knows its parts is given as the list of them (a storage form, never sent)."""
        buffers: list[object] = []
        for name, buf in self.lazy_buffers():
            if isinstance(buf, Deferred):
                parts = buf.parts
                buffers.append([name, list(parts) if parts and not buf.ready else buf.get()])
            else:
                buffers.append([name, buf])
        return [list(self.head.ids), list(self.generations), buffers]

    @classmethod
    def from_wire(
        cls, obj: object, *, limits: Limits = DEFAULT_LIMITS, merge: Merge | None = None
    ) -> State:
        """Decode :meth:`to_wire` (and, given ``merge``, :meth:`to_stored`: a buffer given
        as parts becomes a :class:`Deferred` of ``merge(backend, parts)``); raises
        DecodeError on any malformed field."""
        plain = _plain_state(obj, valid_names(limits), limits.max_clock_width)
        if plain is not None:
            return plain
        head_raw, gens_raw, bufs_raw = expect_list(obj, "state", length=3)
        ids = expect_list(head_raw, "state head", max_len=limits.max_clock_width)
        gens = expect_list(gens_raw, "state generations", length=len(ids))
        pairs = {
            shared_event_id(expect_bytes(i, "head id", length=ID_LENGTH)): expect_int(
                g, "generation", minimum=1
            )
            for i, g in zip(ids, gens, strict=True)
        }
        buffers: dict[str, Buffer] = {}
        for item in expect_list(bufs_raw, "state buffers", max_len=MAX_BUFFERS):
            name_raw, buf = expect_list(item, "state buffer", length=2)
            name = expect_name(name_raw, "backend name", limits=limits)
            if name in buffers:
                raise DecodeError(f"state has two buffers for backend {name!r}")
            if merge is not None and isinstance(buf, list):
                buffers[name] = _stored_parts(name, buf, merge)
            else:
                buffers[name] = expect_bytes(buf, f"buffer of {name}")
        return cls.of(head=pairs, buffers=buffers)


def _plain_state(obj: object, names: set[str], max_width: int) -> State | None:
    """``obj`` decoded in the common shape, checked with no call per field: a head of ids in
    ascending order (at most ``max_width``), a generation of each, and byte buffers under
    known names in order (a stored state, or a peer's snapshot, however many writers
    edited the entity at once). ``None`` for any other shape: :meth:`State.from_wire` then
    checks it field by field, with the errors that say what is wrong."""
    if type(obj) is not list or len(obj) != 3:
        return None
    head, gens, buffers = obj
    plain = _plain_head(head, gens, max_width)
    if plain is None:
        return None
    clock, generations = plain
    if type(buffers) is not list or len(buffers) > MAX_BUFFERS:
        return None
    pairs: list[tuple[str, bytes]] = []
    last = ""
    for item in buffers:
        if type(item) is not list or len(item) != 2:
            return None
        name, buf = item
        if type(name) is not str or name not in names or name <= last or type(buf) is not bytes:
            return None
        pairs.append((name, buf))
        last = name
    return State._of_bytes(clock, generations, tuple(pairs))


def _plain_head(head: object, gens: object, max_width: int) -> tuple[Clock, tuple[int, ...]] | None:
    """:func:`_plain_state`'s head: ids of 32 bytes in ascending order, each with a
    generation of at least 1 (``None`` for any other shape)."""
    if type(head) is not list or type(gens) is not list or len(gens) != len(head):
        return None
    if len(head) == 1:  # (one writer at a time: the commonest head)
        event_id, generation = head[0], gens[0]
        if type(event_id) is not bytes or len(event_id) != ID_LENGTH:
            return None
        if type(generation) is not int or generation < 1:
            return None
        return Clock.single(shared_event_id(event_id)), (generation,)
    if not 1 < len(head) <= max_width:
        return None
    previous = b""
    for event_id, generation in zip(head, gens, strict=True):
        if type(event_id) is not bytes or len(event_id) != ID_LENGTH or event_id <= previous:
            return None
        if type(generation) is not int or generation < 1:
            return None
        previous = event_id
    return Clock._of_sorted(tuple([shared_event_id(i) for i in head])), tuple(gens)


def plain_entity_state(obj: object, names: set[str], max_width: int) -> EntityState | None:
    """:meth:`EntityState.from_wire` of ``obj`` in the common shape (an entity id, a known
    collection, a state :func:`_plain_state` takes), checked with no call per field;
    ``None`` for any other shape, which :meth:`EntityState.from_wire` checks field by field.
    ``max_width``: the most ids a head may hold (``Limits.max_clock_width``). (A fresh
    client decodes a thousand of them per sync: the checked path cost twice as much.)"""
    if type(obj) is not list or len(obj) != 3:
        return None
    entity, collection, raw = obj
    if type(entity) is not bytes or len(entity) != ID_LENGTH:
        return None
    if type(collection) is not str or collection not in names:
        return None
    state = _plain_state(raw, names, max_width)
    return None if state is None else EntityState(EntityId._trusted(entity), collection, state)


Merge = Callable[[str, tuple[bytes, ...]], bytes]
"""How a reader of stored states merges a buffer's parts: (backend name, parts) → buffer;
raises DecodeError for a backend whose buffers have no parts."""


def _stored_parts(name: str, raw: list[object], merge: Merge) -> Deferred:
    parts = tuple(expect_bytes(p, f"a part of the buffer of {name}") for p in raw)
    if not parts:
        raise DecodeError(f"the buffer of {name} is stored as no parts")
    return Deferred(lambda: merge(name, parts), estimate=sum(len(p) for p in parts), parts=parts)


@dataclass(frozen=True, slots=True)
class EntityState:
    """A :class:`State` with the entity it belongs to.

    ``wire``, when known, is :meth:`to_bytes` as a durable engine stored it (see
    :meth:`from_bytes`): a responder puts those bytes in its pages as they are, encoding
    nothing again (:func:`mycelia.proto.delta.encode_deltas`). It is no constructor
    argument, so no copy of a state (``dataclasses.replace``) carries another's bytes.
    """

    entity_id: EntityId
    collection: str
    state: State
    wire: bytes | None = field(default=None, init=False, compare=False, repr=False)

    def to_wire(self) -> list[object]:
        """The positional form used inside messages."""
        return [self.entity_id, self.collection, self.state.to_wire()]

    @classmethod
    def from_wire(
        cls, obj: object, *, limits: Limits = DEFAULT_LIMITS, merge: Merge | None = None
    ) -> EntityState:
        """Decode :meth:`to_wire` (and :meth:`to_stored` given ``merge``, see
        :meth:`State.from_wire`); raises DecodeError on any malformed field."""
        plain = plain_entity_state(obj, valid_names(limits), limits.max_clock_width)
        if plain is not None:
            return plain
        entity_raw, collection, state = expect_list(obj, "entity state", length=3)
        entity = EntityId._trusted(expect_bytes(entity_raw, "entity id", length=ID_LENGTH))
        if type(collection) is not str or collection not in valid_names(limits):
            collection = expect_name(collection, "collection", limits=limits)
        return cls(entity, collection, State.from_wire(state, limits=limits, merge=merge))

    def to_bytes(self) -> bytes:
        """Canonical bytes of this state."""
        wire = self.wire
        return pack(self.to_wire()) if wire is None else wire

    def to_stored(self) -> bytes:
        """The bytes a durable engine stores (:meth:`State.to_stored`: a buffer not
        computed yet may be its parts, so a write need not compute it); read them back with
        :meth:`from_bytes` given a ``merge``."""
        return pack([self.entity_id, self.collection, self.state.to_stored()])

    def wire_size(self, *, estimate: bool = False) -> int:
        """An upper bound of ``len(self.to_bytes())``, without encoding (msgpack adds at
        most 5 bytes of header to a string, binary or array, 9 to an integer). With
        ``estimate``, buffers not computed yet count their estimate (see
        :class:`Deferred`): close, but no bound."""
        if self.wire is not None:
            return len(self.wire)
        state = self.state
        names = sum([15 + len(name) for name in state.backend_names()])
        return (
            64
            + len(self.collection)
            + 39 * len(state.head)
            + names
            + state.buffer_bytes(estimate=estimate)
        )

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        *,
        limits: Limits = DEFAULT_LIMITS,
        merge: Merge | None = None,
        keep: bool = False,
    ) -> EntityState:
        """Decode :meth:`to_bytes` (and :meth:`to_stored` given ``merge``). With ``keep``,
        a state with every buffer in bytes keeps ``data`` as its :attr:`wire`: pass it only
        for bytes this process encoded canonically (a durable engine's own), which are then
        exactly :meth:`to_bytes`."""
        obj = unpack(data, limits=limits, what="entity state")
        decoded = cls.from_wire(obj, limits=limits, merge=merge)
        if keep and decoded.state._parts is None:  # (no buffer given as parts)
            object.__setattr__(decoded, "wire", data)
        return decoded


@dataclass(frozen=True, slots=True)
class Attested(Generic[T]):
    """A payload plus attestations (outside every hash; judged by the policy agent)."""

    payload: T
    attestations: tuple[bytes, ...] = ()
