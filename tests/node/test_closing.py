"""A closed node lets go of what it held at once: its parts hold one another in cycles, so
whatever they still referenced waited for the collector's next full pass (a closed client
of 1,000 entities left 31,000 objects to it; 245 now)."""

from __future__ import annotations

import gc

import pytest

from mycelia import Model, Node
from mycelia.entity import Entity
from mycelia.errors import StorageError
from mycelia.proto import AdmittedEvent, EventId
from mycelia.storage import MemoryStorage
from mycelia.storage.memory import MEMORY_RECENT_EVENTS


class Item(Model, collection="items"):
    n: int


def alive(kind: type) -> int:
    return sum(type(o) is kind for o in gc.get_objects())


async def test_closing_a_node_frees_its_entities_and_events_without_the_collector() -> None:
    storage = MemoryStorage()
    node = await Node.open(storage, durable=True)
    await node.create_system()
    async with node.context().transaction() as trx:
        for n in range(200):
            trx.create(Item, n=n)
    gc.collect()
    entities, events = alive(Entity), alive(AdmittedEvent)
    assert entities >= 200
    gc.disable()
    try:
        await node.close()
        del node
        assert alive(Entity) <= entities - 200
        assert alive(AdmittedEvent) <= events - min(200, MEMORY_RECENT_EVENTS)  # (decoded)
    finally:
        gc.enable()
    with pytest.raises(StorageError, match="closed"):
        await storage.last_offset()  # a closed store refuses every call, these too
    with pytest.raises(StorageError, match="closed"):
        await storage.event_stored(EventId(bytes(32)))
