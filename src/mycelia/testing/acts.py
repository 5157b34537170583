"""What a simulated create, edit or delete does inside its transaction, and the foreign
events a run replays to test that nodes refuse another system's entities
(:mod:`mycelia.testing.simulator`)."""

from __future__ import annotations

import random

from mycelia.entity.model import Model
from mycelia.node import Node, Transaction
from mycelia.proto import Event
from mycelia.storage import MemoryStorage
from mycelia.testing.actions import Action, Create, Delete, Edit
from mycelia.testing.fields import apply_edit, random_values
from mycelia.testing.simnode import SimNode

__all__ = ["act", "foreign_events"]


async def act(trx: Transaction, sn: SimNode, model: type[Model], action: Action) -> bool:
    """One create/edit/delete action inside ``trx``; False if it had nothing to act on."""
    if isinstance(action, Create):
        trx.create(model, **dict(action.values))
        return True
    assert isinstance(action, Edit | Delete)
    alive = sn.alive(model.__collection__)
    if not alive:
        return False
    entity_id = alive[action.pick % len(alive)]
    if isinstance(action, Delete):
        await trx.delete(model, entity_id)
        return True
    handle = await trx.edit(model, entity_id)
    for step in action.steps:
        apply_edit(handle, step)
    return True


async def foreign_events(seed: int, model: type[Model]) -> list[Event]:
    """Two entities (and an edit) of another system, for intrusions."""
    rng = random.Random(f"mycelia-sim/foreign/{seed}")
    node = await Node.open(MemoryStorage(), durable=True, rng=rng)
    await node.create_system()
    async with node.context().transaction() as trx:
        ids = [trx.create(model, **random_values(model, rng)).id for _ in range(2)]
    events: list[Event] = []
    for entity_id in ids:
        events.extend(e.event for e in await node.storage.events_of(entity_id))
    return events
