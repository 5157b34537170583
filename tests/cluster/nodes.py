"""Nodes in this process on one PostgreSQL schema (one system), and the steps the feed
tests take with them: open two nodes, create a card, set its counter, rebuild an entity
from its events alone, and hold a node behind on an entity another node has moved on.

Each node has its own engine, so what one commits reaches the other only through the
store's change feed (ARCHITECTURE.md §6, §7).
"""

from __future__ import annotations

from mycelia import EntityId, Node
from mycelia.entity import Entity
from mycelia.entity.verdicts import head_after
from mycelia.proto import AdmittedEvent
from mycelia.storage.postgres import PostgresStorage
from tests.cluster.models import Card
from tests.storage.conftest import PostgresSchemas


async def open_pair(
    schemas: PostgresSchemas, **options: float
) -> tuple[Node, Node, PostgresStorage, PostgresStorage]:
    """Two durable nodes on one schema (one system), each with its own engine."""
    schema = schemas.new_schema()
    first = await PostgresStorage(schemas.dsn, schema=schema, **options).open()  # type: ignore[arg-type]
    a = await Node.open(first, durable=True)
    await a.create_system()
    second = await PostgresStorage(schemas.dsn, schema=schema, **options).open()  # type: ignore[arg-type]
    b = await Node.open(second, durable=True)
    assert b.system_root == a.system_root
    return a, b, first, second


async def create(node: Node, title: str) -> EntityId:
    async with node.context().transaction() as trx:
        return trx.create(Card, title=title, body="").id


async def set_n(node: Node, entity: EntityId, n: int) -> None:
    async with node.context().transaction() as trx:
        (await trx.edit(Card, entity)).n = n


def replay(events: list[AdmittedEvent]) -> Entity:
    """The entity rebuilt from its events alone (parents first)."""
    entity = Entity.empty(events[0].entity_id, events[0].collection)
    applied = []
    for event in events:
        entity.apply(event)
        applied.append(event)
    entity.set_head(head_after({}, applied))
    return entity


async def behind(schemas: PostgresSchemas) -> tuple[Node, Node, PostgresStorage, EntityId]:
    """Nodes a and b on one schema, and an entity b holds at its genesis while a commits
    on it: b hears of nothing (its follower is stopped, so nothing evicts or refreshes
    what it holds: a follower that missed the NOTIFY is there for a moment)."""
    schema = schemas.new_schema()
    a = await Node.open(await PostgresStorage(schemas.dsn, schema=schema).open(), durable=True)
    await a.create_system()
    entity = await create(a, "t")
    deaf = PostgresStorage(schemas.dsn, schema=schema, listen=False, poll_interval=600)
    b = await Node.open(await deaf.open(), durable=True)
    (following,) = [t for t in b._tasks if "FeedFollower.run" in repr(t.get_coro())]
    following.cancel()
    assert (await b.context().get(Card, entity)).n == 0  # b holds it at the genesis
    await set_n(a, entity, 1)
    return a, b, deaf, entity
