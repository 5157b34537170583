"""The resident-entity set: at most one in-memory :class:`Entity` per id on a node.

Entities are held weakly (anyone still using one keeps it alive) plus a small strong LRU of
recently used ones, so a hot entity is not re-decoded from storage on every commit. A
resident is always either equal to what storage holds or ahead of it only inside an
applier run that holds the entity's lock; an applier that fails evicts what it touched.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Final

from mycelia.entity.entity import Entity
from mycelia.proto import EntityId

__all__ = ["DEFAULT_KEEP", "Residents"]

DEFAULT_KEEP: Final = 1024
"""Entities kept strongly (most recently used)."""


class Residents:
    """One in-memory entity per id (weakly held, with a strong LRU)."""

    __slots__ = ("_keep", "_recent", "_weak")

    def __init__(self, *, keep: int = DEFAULT_KEEP) -> None:
        self._weak: weakref.WeakValueDictionary[EntityId, Entity] = weakref.WeakValueDictionary()
        self._recent: OrderedDict[EntityId, Entity] = OrderedDict()
        self._keep = keep

    def get(self, entity_id: EntityId) -> Entity | None:
        """The resident entity, if one is in memory."""
        entity = self._weak.get(entity_id)
        if entity is not None:
            self._touch(entity)
        return entity

    def put(self, entity: Entity) -> Entity:
        """Make ``entity`` the resident for its id (replacing any other)."""
        self._weak[entity.entity_id] = entity
        self._touch(entity)
        return entity

    def evict(self, entity_id: EntityId) -> None:
        """Forget the resident (the next reader reloads it from storage)."""
        self._weak.pop(entity_id, None)
        self._recent.pop(entity_id, None)

    def clear(self) -> None:
        """Forget every resident."""
        self._weak.clear()
        self._recent.clear()

    def _touch(self, entity: Entity) -> None:
        recent = self._recent
        recent[entity.entity_id] = entity
        recent.move_to_end(entity.entity_id)
        while len(recent) > self._keep:
            recent.popitem(last=False)

    def __len__(self) -> int:
        return len(self._weak)
