"""Nodes on one PostgreSQL follow its change feed: what another node commits reaches this
node's live queries, its residents (refreshed, not dropped, so its next commit builds on
the other's) and the clients it serves. Two nodes committing to one entity at once lose no
head and orphan no event; a commit planned on a head another node has moved past is joined
with the one it missed, and a commit resent to a node behind on it is joined into the
stored state, no event twice (ARCHITECTURE.md §6, §7)."""

from __future__ import annotations

import asyncio

import pytest

from mycelia import EntityId, Node
from mycelia.errors import EntityNotFound
from mycelia.node.inprocess import InProcessServer
from mycelia.proto import Clock
from mycelia.storage import MemoryStorage
from tests.cluster.models import Card
from tests.cluster.nodes import behind, create, open_pair, replay, set_n
from tests.node.waiting import until
from tests.storage.conftest import PostgresSchemas

pytestmark = pytest.mark.postgres


async def test_a_live_query_on_one_node_sees_what_another_node_commits(
    pair: tuple[Node, Node],
) -> None:
    a, b = pair
    async with b.context().query(Card, "n >= 0 ORDER BY n") as live:
        entity = await create(a, "made on a")
        await until(b, lambda: _has(live.items, entity, 0))
        await set_n(a, entity, 7)
        await until(b, lambda: _has(live.items, entity, 7))
        assert [c.title for c in live.items] == ["made on a"]


async def _has(items: list[Card], entity: EntityId, n: int) -> bool:
    return any(c.id == entity and c.n == n for c in items)


async def test_a_resident_entity_is_refreshed_so_the_next_commit_builds_on_the_other_node(
    pair: tuple[Node, Node],
) -> None:
    a, b = pair
    entity = await create(a, "t")
    await until(b, lambda: _n(b, entity, 0))
    await set_n(b, entity, 1)  # b holds the entity in memory from now on
    await until(a, lambda: _n(a, entity, 1))
    await set_n(a, entity, 2)
    await until(b, lambda: _n(b, entity, 2))
    assert b.resident_state(entity) is not None, "b's resident was refreshed, not dropped"
    view_a = await a.context().get(Card, entity)
    view_b = await b.context().get(Card, entity)
    assert view_a.head == view_b.head
    assert len(view_a.head) == 1, "each commit built on the other's: no fork"


async def _n(node: Node, entity: EntityId, n: int) -> bool:
    try:
        return (await node.context().get(Card, entity)).n == n
    except EntityNotFound:
        return False


async def test_a_client_of_one_node_sees_what_another_node_commits(
    pair: tuple[Node, Node],
) -> None:
    a, b = pair
    entity = await create(a, "t")
    client = await Node.open(MemoryStorage(), durable=False)
    try:
        async with InProcessServer(b) as server:
            server.connect(client)
            await client.wait_ready(timeout=10)
            async with client.context().query(Card, "") as live:
                await until(client, lambda: _has(live.items, entity, 0))
                for n in range(1, 6):
                    await set_n(a, entity, n)
                    await until(client, lambda n=n: _has(live.items, entity, n))  # type: ignore[misc]
    finally:
        await client.close()


async def test_two_nodes_committing_to_one_entity_a_thousand_times_lose_no_head_and_orphan_no_event(
    pg_schemas: PostgresSchemas,
) -> None:
    a, b, storage, _ = await open_pair(pg_schemas)
    try:
        entity = await create(a, "contended")
        await until(b, lambda: _n(b, entity, 0))

        async def writer(node: Node, name: str, count: int) -> None:
            for i in range(count):
                async with node.context().transaction() as trx:
                    card = await trx.edit(Card, entity)
                    card.n = i
                    card.title = f"{name}{i}"

        sides = (("a", a), ("b", b))
        await asyncio.gather(
            *(writer(node, f"{s}{t}.", 125) for s, node in sides for t in range(4))
        )
        events = await storage.events_of(entity)
        assert len(events) == 1 + 1000
        stored = await storage.get_state(entity)
        assert stored is not None
        parents = {p for e in events for p in e.parent}
        maximal = {e.id for e in events if e.id not in parents}
        assert set(stored.state.head) == maximal, "a head was lost or an event orphaned"
        replayed = replay(events)
        assert stored.state.head == replayed.head
        assert stored == replayed.to_state(), "the stored state is not that of its events"
        for node in (a, b):
            await until(node, lambda node=node: _at(node, entity, stored.state.head))  # type: ignore[misc]
            view = await node.context().get(Card, entity)
            assert (view.n, view.title) == (replayed.values()["n"], replayed.values()["title"])
    finally:
        await a.close()
        await b.close()


async def _at(node: Node, entity: EntityId, head: Clock) -> bool:
    state = node.resident_state(entity)
    return state is None or state.state.head == head


async def test_a_commit_planned_on_a_stale_head_is_joined_with_the_one_it_missed(
    pg_schemas: PostgresSchemas,
) -> None:
    a, b, deaf, entity = await behind(pg_schemas)
    try:
        async with b.context().transaction() as trx:  # planned on the genesis: stale
            (await trx.edit(Card, entity)).title = "from b"
        stored = await deaf.get_state(entity)
        assert stored is not None
        assert len(stored.state.head) == 2, "both heads kept"
        events = await deaf.events_of(entity)
        assert stored == replay(events).to_state()
        await until(a, lambda: _joined(a, entity))  # (b's follower, which would, is stopped)
    finally:
        await a.close()
        await b.close()


async def test_a_commit_resent_to_a_node_behind_on_it_is_joined_into_the_stored_state(
    pg_schemas: PostgresSchemas,
) -> None:
    """A client failing over pushes its commit again to another server, which stored it
    meanwhile through the first one but holds the entity from before: the resent commit is
    on the head that server holds, so it is planned without a lookup, and the write's join
    makes it the no-op it is."""
    a, b, deaf, entity = await behind(pg_schemas)
    try:
        stored = await deaf.get_state(entity)
        event = (await deaf.events_of(entity))[-1]
        result = await b._commit_remote([[event.event]], lambda *_: None)  # the server's path
        assert [e.id for e in result.stored] == [event.id]  # planned as new on b's head
        assert await deaf.get_state(entity) == stored, "joined: the state is the one a stored"
        assert [e.id for e in await deaf.events_of(entity)][-1] == event.id
        assert len(await deaf.events_of(entity)) == 2, "no event twice"
        view = await b.context().get(Card, entity)
        assert (view.n, view.head) == (1, Clock([event.id]))
    finally:
        await a.close()
        await b.close()


async def _joined(node: Node, entity: EntityId) -> bool:
    view = await node.context().get(Card, entity)
    return (view.n, view.title, len(view.head)) == (1, "from b", 2)
