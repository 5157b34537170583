"""One entity's materialised state: its head and its property backends (ARCHITECTURE.md §5).

Invariants:

- ``head`` maps each head event id to its generation and is an antichain: the applier only
  ever sets it to the ``merged_head`` of a comparison (the maximal ids of old head and new
  events), never by hand.
- Backends are created on demand by name: ``lww`` and ``text`` are known; any other name
  (from a newer peer) is kept by an :class:`OpaqueBackend`, so nothing is dropped.
- :meth:`to_state` / :meth:`from_state` round-trip byte for byte.
- Mutation happens only through :meth:`apply`, :meth:`set_head` and :meth:`advance`
  (called by the applier under the entity's lock) and on forks that transactions own.
- Placing an event costs O(its parents), not O(the head): :meth:`advance` moves the head
  in place (its tips named as parents leave, the new events join), and the head's clock
  and generations are kept sorted by insertion (C-speed copies), never re-sorted;
  its largest generation is kept as it moves (:attr:`top_generation`, O(1)).
- ``history_closed`` says whether every tip of the head is a stored event (``None``:
  not known yet). The applier sets it; only then may it place a new event with no walk.
- ``boundary`` holds the tips of the snapshots a cache merged (id → generation, the last
  :data:`BOUNDARY` of them): events in the history that the cache may never store. An
  event naming one is admitted like one naming a tip (the applier keeps it; empty on a
  durable node). ``boundary_top`` is the highest generation ever marked there (it never
  falls, though the oldest tips are forgotten): no event above it is below a snapshot.
- Text client ids come only from the :class:`ClientIds` the entity carries (given at
  construction, handed on to its forks): a text backend created lazily on it draws from
  them. An entity without them (a resident, a decoded state) holds replica text, which
  takes no local edits, so no entropy is ever read here.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from mypy_extensions import mypyc_attr

from mycelia.entity.backends import Backend, ClientIds, LwwBackend, OpaqueBackend, TextBackend
from mycelia.entity.backends.lww import state_values
from mycelia.entity.backends.text import merge_parts
from mycelia.errors import DecodeError
from mycelia.proto import (
    AdmittedEvent,
    Buffer,
    Clock,
    Deferred,
    EntityId,
    EntityState,
    EventId,
    State,
)

__all__ = [
    "BOUNDARY",
    "DELETED",
    "KNOWN_BACKENDS",
    "Entity",
    "Snapshot",
    "plain_values",
    "stored_merge",
]

BOUNDARY: Final = 64
"""Merged snapshots' tips an entity remembers (see ``boundary`` in the module)."""
DELETED: Final = "_deleted"
"""The reserved LWW property a deletion sets (a tombstone; no model field may use it)."""

KNOWN_BACKENDS: Final[Mapping[str, type[LwwBackend] | type[TextBackend]]] = MappingProxyType(
    {LwwBackend.name: LwwBackend, TextBackend.name: TextBackend}
)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A frozen view of an entity at one head: what views, policy and live queries read."""

    entity_id: EntityId
    collection: str
    head: Clock
    values: Mapping[str, object]

    @property
    def exists(self) -> bool:
        """Whether the entity has been created (its head is not empty)."""
        return bool(self.head)

    @property
    def deleted(self) -> bool:
        """Whether the entity has been deleted (tombstoned)."""
        return self.values.get(DELETED) is True


# A plain Python class where the module is compiled: residents hold it by weak reference,
# which mypyc's native classes do not support.
@mypyc_attr(native_class=False)
class Entity:
    """Head (id → generation) plus backends for one entity."""

    __slots__ = (
        "__weakref__",
        "_backends",
        "_clock",
        "_gens",
        "_head",
        "_snapshot",
        "_state",
        "_text_ids",
        "_top",
        "boundary",
        "boundary_top",
        "collection",
        "entity_id",
        "history_closed",
    )

    def __init__(
        self,
        entity_id: EntityId,
        collection: str,
        head: dict[EventId, int],
        backends: dict[str, Backend],
        *,
        text_ids: ClientIds | None = None,
    ) -> None:
        self.entity_id = entity_id
        self.collection = collection
        self._head = head
        self._backends = backends
        self._snapshot: Snapshot | None = None  # valid until the next change
        self._state: EntityState | None = None  # to_state(), until the next change
        self._clock: Clock | None = None  # the head as a Clock (kept current once built)
        self._gens: tuple[int, ...] = ()  # the generations of the clock's ids, aligned
        self._top: int | None = None  # the head's largest generation (None: not computed)
        self._text_ids = text_ids  # where a text backend created here gets its client id
        self.history_closed: bool | None = None  # every tip stored? (None: not known yet)
        self.boundary: dict[EventId, int] = {}  # merged snapshots' tips (see the module)
        self.boundary_top = 0  # their highest generation ever (see the module)

    @classmethod
    def empty(
        cls, entity_id: EntityId, collection: str, *, text_ids: ClientIds | None = None
    ) -> Entity:
        """An entity that does not exist yet (empty head); text created on it draws from
        ``text_ids`` (replica text without)."""
        return cls(entity_id, collection, {}, {}, text_ids=text_ids)

    @classmethod
    def from_state(
        cls, stored: EntityState, *, text_ids: ClientIds | None = None, canonical: bool = False
    ) -> Entity:
        """Materialise a stored state (its text draws from ``text_ids``; replica text
        without); raises DecodeError on a malformed buffer. ``canonical``: ``stored`` is
        known to be canonical (this node's own storage, or its durable peer's word), so
        :meth:`to_state` gives it back until the entity changes, without encoding it."""
        state = stored.state
        backends = {name: _backend(name, text_ids, buffer) for name, buffer in state.lazy_buffers()}
        head = state.head_generations()
        entity = cls(stored.entity_id, stored.collection, head, backends, text_ids=text_ids)
        entity._clock, entity._gens = state.head, state.generations  # (aligned, sorted)
        if canonical:
            entity._state = stored
        return entity

    def to_state(self) -> EntityState:
        """The entity as a state snapshot (canonical buffers; text's computed when first
        read, ARCHITECTURE.md §5)."""
        known = self._state
        if known is not None:
            return known
        backends = self._backends
        names = sorted(backends) if len(backends) > 1 else list(backends)
        buffers = tuple([(name, _buffer(backends[name])) for name in names])
        clock = self.head
        return EntityState(self.entity_id, self.collection, State(clock, self._gens, buffers))

    @property
    def head(self) -> Clock:
        """The head clock."""
        clock = self._clock
        if clock is None:
            head = self._head
            clock = self._clock = Clock.single(next(iter(head))) if len(head) == 1 else Clock(head)
            self._gens = tuple([head[i] for i in clock.ids])
        return clock

    @property
    def head_generations(self) -> dict[EventId, int]:
        """The head as id → generation (a copy)."""
        return dict(self._head)

    @property
    def head_map(self) -> Mapping[EventId, int]:
        """The head as id → generation, read-only and live (no copy: O(1))."""
        return MappingProxyType(self._head)

    @property
    def exists(self) -> bool:
        """Whether the entity has been created here."""
        return bool(self._head)

    @property
    def top_generation(self) -> int:
        """The largest generation in the head (0 before the genesis), kept as the head
        moves: O(1)."""
        top = self._top
        if top is None:
            top = self._top = max(self._head.values(), default=0)
        return top

    def apply(self, event: AdmittedEvent) -> set[str]:
        """Apply one event's operations to the backends (the head is set separately).

        Returns the names of the properties whose values changed. Raises DecodeError for a
        malformed diff; the caller then discards this copy of the entity.
        """
        self._snapshot = self._state = None
        changed: set[str] = set()
        for name, diffs in event.event.operations:
            changed |= self.backend(name).apply(event, diffs)
        return changed

    def merge_state(self, stored: EntityState) -> set[str]:
        """Join another replica's state into this one (every backend is a state CRDT).

        The head is not touched: the caller sets the merged head from a comparison.
        Raises DecodeError for a malformed buffer (the caller discards this copy).
        """
        self._snapshot = self._state = None
        changed: set[str] = set()
        for name, buffer in stored.state.buffers:
            theirs = _backend(name, None, buffer)  # only read: replica text
            mine = self.backend(name)
            changed |= mine.merge(theirs)
        return changed

    def mark_boundary(self, head: Mapping[EventId, int]) -> None:
        """Remember a merged snapshot's tips as history this node may not store (at most
        :data:`BOUNDARY`, the oldest forgotten first: an event naming a forgotten one is
        only held until its parents are fetched)."""
        boundary = self.boundary
        boundary.update(head)
        self.boundary_top = max(self.boundary_top, *head.values(), 0)
        while len(boundary) > BOUNDARY:
            del boundary[next(iter(boundary))]

    def set_head(self, head: Mapping[EventId, int]) -> None:
        """Replace the head (the applier passes a comparison's ``merged_head``)."""
        self._snapshot = self._state = None
        self._clock = None
        self._top = None
        self._head = dict(head)

    def advance(self, applied: Sequence[AdmittedEvent]) -> None:
        """Move the head past ``applied`` (every event the head lacked, parents first):
        the tips they name as parents leave, the ones no other of them names join — what
        :func:`~mycelia.entity.verdicts.head_after` gives, in O(their parents)."""
        self._snapshot = self._state = None
        head = self._head
        if len(applied) == 1 and len(head) == 1:  # a linear history: one tip replaces one
            event = applied[0]
            tip = event.id
            if event.parent.ids == tuple(head) and tip not in head:
                head.clear()
                head[tip] = event.generation
                self._clock = Clock.single(tip)
                self._gens = (event.generation,)
                self._top = event.generation
                return
        named = {p for e in applied for p in e.parent}
        gone = [p for p in named if p in head]
        joined = [(e.id, e.generation) for e in applied if e.id not in named and e.id not in head]
        for tip in gone:
            del head[tip]
        head.update(joined)
        if self._top is not None and joined:
            # A tip that left is the parent of an applied event, so below a joined one: the
            # largest generation is the old one or a joined one's.
            self._top = max(self._top, *(g for _, g in joined))
        clock = self._clock
        if clock is None:
            return
        ids, gens = list(clock.ids), list(self._gens)  # one copy each way: memcpy speed
        for tip in gone:
            i = bisect_left(ids, tip)
            del ids[i], gens[i]
        for tip, generation in joined:
            i = bisect_left(ids, tip)
            ids.insert(i, tip)
            gens.insert(i, generation)
        self._clock = Clock._of_sorted(tuple(ids))  # kept sorted by insertion
        self._gens = tuple(gens)

    def backend(self, name: str) -> Backend:
        """The backend called ``name``, created empty on first use."""
        backend = self._backends.get(name)
        if backend is None:
            backend = self._backends[name] = _backend(name, self._text_ids)
        # A caller may edit through the backend (drafts do): the snapshot cannot be trusted.
        self._snapshot = self._state = None
        return backend

    def lww(self) -> LwwBackend:
        """The LWW backend."""
        backend = self.backend(LwwBackend.name)
        assert isinstance(backend, LwwBackend)
        return backend

    def text(self) -> TextBackend:
        """The text backend."""
        backend = self.backend(TextBackend.name)
        assert isinstance(backend, TextBackend)
        return backend

    def has_backend(self, name: str) -> bool:
        """Whether the backend exists yet (without creating it)."""
        return name in self._backends

    def fork(self, *, text_ids: ClientIds | None = None) -> Entity:
        """An independent copy for a transaction, carrying ``text_ids`` (else this entity's).

        Its text draws a fresh client id from them, now or when text is first written on
        the fork; without any, the fork's text is a replica's (it refuses local edits).
        """
        ids = self._text_ids if text_ids is None else text_ids
        backends: dict[str, Backend] = {}
        for name, backend in self._backends.items():
            if isinstance(backend, TextBackend):
                backends[name] = backend.fork(ids)
            else:
                backends[name] = backend.fork()
        return Entity(self.entity_id, self.collection, dict(self._head), backends, text_ids=ids)

    def prepare_text(self, ids: ClientIds) -> None:
        """Create the (empty) text backend now, drawing its client id from ``ids``."""
        if TextBackend.name not in self._backends:
            self._state = None
            self._backends[TextBackend.name] = TextBackend.empty(ids)

    def with_id(self, entity_id: EntityId) -> Entity:
        """This entity's backends under another id (a create's draft, once its genesis exists)."""
        head = dict(self._head)
        return Entity(entity_id, self.collection, head, self._backends, text_ids=self._text_ids)

    def take_operations(self) -> dict[str, list[bytes]]:
        """The local edits on this fork, as event operations (backend → diffs)."""
        ops: dict[str, list[bytes]] = {}
        for name, backend in self._backends.items():
            diff = backend.take_diff()
            if diff is not None:
                ops[name] = [diff]
        return ops

    def values(self) -> dict[str, object]:
        """Every property's current value (LWW values and text content)."""
        out: dict[str, object] = {}
        for backend in self._backends.values():
            out.update(backend.values())
        return out

    def sizing_values(self) -> tuple[list[object], int]:
        """What a size estimate reads: every value that is cheap to read, and the length of
        the texts that are not (a text read after a remote update costs O(document))."""
        snapshot = self._snapshot
        if snapshot is not None:
            return list(snapshot.values.values()), 0
        values: list[object] = []
        chars = 0
        for backend in self._backends.values():
            if type(backend) is TextBackend:
                chars += backend.length()
            else:
                values.extend(backend.values().values())
        return values, chars

    def snapshot(self) -> Snapshot:
        """A frozen view of the entity now (cached until the entity changes)."""
        snapshot = self._snapshot
        if snapshot is None:
            values = MappingProxyType(self.values())
            snapshot = self._snapshot = Snapshot(self.entity_id, self.collection, self.head, values)
        return snapshot


def _buffer(backend: Backend) -> bytes | Deferred:
    """A backend's state buffer (text's computed when first read, ARCHITECTURE.md §5)."""
    if type(backend) is TextBackend:
        return backend.deferred_state()
    return backend.to_state()


def _backend(name: str, text_ids: ClientIds | None, buffer: Buffer | None = None) -> Backend:
    """A backend called ``name``: empty, or rebuilt from ``buffer`` (a text from its
    buffer's parts when it has them and is not computed yet; DecodeError if bad)."""
    if isinstance(buffer, Deferred):
        if name == TextBackend.name and buffer.parts and not buffer.ready:
            return TextBackend.from_parts(buffer.parts, text_ids)
        buffer = buffer.get()
    if name == TextBackend.name:
        if buffer is None:
            return TextBackend.empty(text_ids)
        return TextBackend.from_state(buffer, text_ids)
    cls = KNOWN_BACKENDS.get(name, OpaqueBackend)
    return cls.empty() if buffer is None else cls.from_state(buffer)


def plain_values(state: State) -> dict[str, object] | None:
    """The values of a state holding no buffer but LWW bytes (what
    ``Entity.from_state(...).values()`` gives, without the entity); ``None`` for any other
    (a text's values cost a document to decode). Raises DecodeError on a malformed buffer."""
    buffers = state.lazy_buffers()
    if not buffers:
        return {}
    if len(buffers) != 1:
        return None
    name, buffer = buffers[0]
    if name != LwwBackend.name or type(buffer) is not bytes:
        return None
    return state_values(buffer)


def stored_merge(name: str, parts: tuple[bytes, ...]) -> bytes:
    """A stored buffer given as parts, merged (:data:`mycelia.proto.state.Merge`): only a
    text's are; DecodeError for another backend's or a malformed part."""
    if name != TextBackend.name:
        raise DecodeError(f"a stored {name!r} buffer is given as parts: only text's can be")
    return merge_parts(parts)
