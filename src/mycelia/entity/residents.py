"""The resident-entity set: at most one in-memory :class:`Entity` per id on a node.

Entities are held weakly (anyone still using one keeps it alive) plus a small strong LRU of
recently used ones, so a hot entity is not re-decoded from storage on every commit. The
LRU is bounded twice: at most ``keep`` entities and at most ``keep_bytes`` of them (each
entity's size estimated from its values when it is put), so a few large entities cannot
pin memory that a thousand small ones would not. A resident is always either equal to
what storage holds or ahead of it only inside an applier run that holds the entity's
lock; an applier that fails evicts what it touched.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Final, Self

from mycelia.entity.entity import Entity
from mycelia.proto import EntityId

__all__ = ["DEFAULT_KEEP", "DEFAULT_KEEP_BYTES", "Residents", "resident_size"]

DEFAULT_KEEP: Final = 1024
"""Entities kept strongly (most recently used)."""
DEFAULT_KEEP_BYTES: Final = 32 * 1024 * 1024
"""Bytes of entities kept strongly (estimated, see :func:`resident_size`)."""
_OVERHEAD: Final = 512
"""What an entity costs besides its values (objects, head, backends)."""


class Residents:
    """One in-memory entity per id (weakly held, with a strong LRU bounded in count and
    bytes)."""

    __slots__ = ("_bytes", "_keep", "_keep_bytes", "_on_gone", "_recent", "_sizes", "_weak")

    def __init__(self, *, keep: int = DEFAULT_KEEP, keep_bytes: int = DEFAULT_KEEP_BYTES) -> None:
        # A plain dict of weak references, not a WeakValueDictionary: its ``get`` raises and
        # catches KeyError on a miss, and a fresh client misses a thousand times at once.
        self._weak: dict[EntityId, _Held] = {}
        self._recent: OrderedDict[EntityId, Entity] = OrderedDict()
        self._sizes: dict[EntityId, int] = {}
        """The estimated size of each entity in ``_recent`` (kept apart: a pair per put would
        be one more object a change leaves for the garbage collector to track)."""
        self._keep = keep
        self._keep_bytes = keep_bytes
        self._bytes = 0
        self._on_gone = self._gone  # one bound method for every weak reference (not one each)

    @property
    def kept_bytes(self) -> int:
        """The estimated bytes of the entities kept strongly now."""
        return self._bytes

    def get(self, entity_id: EntityId) -> Entity | None:
        """The resident entity, if one is in memory."""
        kept = self._recent.get(entity_id)
        if kept is not None:  # kept strongly: the resident itself (put keeps both in step)
            self._recent.move_to_end(entity_id)
            return kept
        held = self._weak.get(entity_id)
        entity = None if held is None else held()
        if entity is not None:
            self._keep_strongly(entity)
        return entity

    def put(self, entity: Entity) -> Entity:
        """Make ``entity`` the resident for its id (replacing any other; its size is
        estimated again, as it may have changed)."""
        entity_id = entity.entity_id
        if self._recent.get(entity_id) is entity:  # the resident itself, changed: resize it
            size = resident_size(entity)
            self._bytes += size - self._sizes[entity_id]
            self._sizes[entity_id] = size
            self._recent.move_to_end(entity_id)
            self._shrink()
            return entity
        self._weak[entity_id] = _Held(entity, self._on_gone, entity_id)
        self._keep_strongly(entity)
        return entity

    def _gone(self, held: _Held) -> None:
        """An entity nobody holds any longer was freed: forget its entry (if still its)."""
        if self._weak.get(held.entity_id) is held:
            del self._weak[held.entity_id]

    def evict(self, entity_id: EntityId) -> None:
        """Forget the resident (the next reader reloads it from storage)."""
        self._weak.pop(entity_id, None)
        self._drop(entity_id)

    def clear(self) -> None:
        """Forget every resident."""
        self._weak.clear()
        self._recent.clear()
        self._sizes.clear()
        self._bytes = 0

    def _keep_strongly(self, entity: Entity) -> None:
        self._drop(entity.entity_id)
        size = resident_size(entity)
        self._recent[entity.entity_id] = entity
        self._sizes[entity.entity_id] = size
        self._bytes += size
        self._shrink()

    def _shrink(self) -> None:
        recent = self._recent
        while len(recent) > 1 and (len(recent) > self._keep or self._bytes > self._keep_bytes):
            dropped, _ = recent.popitem(last=False)
            self._bytes -= self._sizes.pop(dropped)

    def _drop(self, entity_id: EntityId) -> None:
        if self._recent.pop(entity_id, None) is not None:
            self._bytes -= self._sizes.pop(entity_id)

    def __len__(self) -> int:
        return len(self._weak)


class _Held(weakref.ref[Entity]):
    """A weak reference to a resident that knows its id (for :meth:`Residents._gone`)."""

    __slots__ = ("entity_id",)
    entity_id: EntityId

    def __new__(cls, entity: Entity, gone: Callable[[_Held], None], entity_id: EntityId) -> Self:
        held = super().__new__(cls, entity, gone)
        held.entity_id = entity_id
        return held

    def __init__(self, entity: Entity, gone: Callable[[_Held], None], entity_id: EntityId) -> None:
        # (weakref.ref's own __init__ takes the referent and callback; typeshed omits it)
        super().__init__(entity, gone)  # type: ignore[call-arg]


def resident_size(entity: Entity) -> int:
    """An estimate of the memory ``entity`` holds: its values (decoded, and again as their
    encoded form and backend state), plus a fixed overhead. Texts count their length, so
    this never reads one (O(document)): every put estimates."""
    values, chars = entity.sizing_values()
    total = chars
    for value in values:  # the common kinds inline: every put
        kind = type(value)
        if kind is str or kind is bytes:
            total += 48 + len(value)  # type: ignore[arg-type]  # str or bytes (checked)
        elif kind is int or kind is float or kind is bool or value is None:
            total += 32
        else:
            total += _value_size(value)
    return _OVERHEAD + 3 * total


def _value_size(value: object, depth: int = 0) -> int:
    if isinstance(value, str | bytes):
        return 48 + len(value)
    if depth < 8 and isinstance(value, list | tuple):
        return 56 + sum(_value_size(v, depth + 1) for v in value)
    if depth < 8 and isinstance(value, dict):
        return 64 + sum(
            _value_size(k, depth + 1) + _value_size(v, depth + 1) for k, v in value.items()
        )
    return 32
