"""Stored entities made resident: what the applier reads before it plans (ARCHITECTURE.md §5).

:class:`ResidentLoader` gives the resident entity of an id, decoding its stored state into
the :class:`~mycelia.entity.residents.Residents` the first time (and again once memory has
let it go). On an ephemeral node a stored state may be a snapshot whose history is not
here, so its head's tips are marked as the boundary of what is held
(:meth:`Entity.mark_boundary`). Many ids at once cost one storage read for those not
resident: a fresh client adopts a thousand snapshots in one batch.
"""

from __future__ import annotations

from collections.abc import Collection

from mycelia.entity.entity import Entity
from mycelia.entity.residents import Residents
from mycelia.proto import EntityId, EntityState
from mycelia.retrieval import EntityStore

__all__ = ["ResidentLoader"]


class ResidentLoader:
    """Resident entities, loaded from ``store`` when memory does not hold them."""

    __slots__ = ("_durable", "_residents", "_store")

    def __init__(self, store: EntityStore, residents: Residents, *, durable: bool) -> None:
        self._store = store
        self._residents = residents
        self._durable = durable

    async def load(self, entity_id: EntityId) -> Entity | None:
        """The resident entity, loading its stored state if needed (``None`` if unknown)."""
        entity = self._residents.get(entity_id)
        if entity is None:
            stored = await self._store.get_state(entity_id)
            if stored is not None:
                entity = self._made_resident(stored)
        return entity

    async def load_many(self, entity_ids: Collection[EntityId]) -> dict[EntityId, Entity]:
        """:meth:`load` of many entities, with one storage read for those not resident; the
        unknown ones are left out."""
        get = self._residents.get
        held = {i: e for i in entity_ids if (e := get(i)) is not None}
        rest = [i for i in entity_ids if i not in held]
        for entity_id, stored in (await self._store.get_states(rest) if rest else {}).items():
            held[entity_id] = self._made_resident(stored)
        return held

    def _made_resident(self, stored: EntityState) -> Entity:
        entity = self._residents.put(Entity.from_state(stored, canonical=True))
        if not self._durable:  # a snapshot's tips, maybe: see Entity.boundary
            entity.mark_boundary(entity.head_map)
        return entity
