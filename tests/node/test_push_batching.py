"""A subscriber that fell behind gets the commits queued for it in one push, in commit
order (mycelia.node.pushes.SubscriberFeed.get), cut into pages so that a receiver, which
takes a page's states before its events, never takes a state before the events it
follows (mycelia.node.serving._pages)."""

from __future__ import annotations

import asyncio
from typing import Any

from mycelia import EntityId, Model, Node
from mycelia.entity import EntityChange
from mycelia.node import serving
from mycelia.node.inprocess import InProcessServer
from mycelia.node.pushes import TAKE_BYTES, SubscriberFeed
from mycelia.proto.peering import Delta, SubscriptionUpdate
from mycelia.storage import MemoryStorage
from tests.node.waiting import until


class Item(Model, collection="items"):
    n: int = 0


def _changes(n: int) -> list[EntityChange]:
    """Stand-ins: the feed only keeps and joins the lists it is given."""
    return [object() for _ in range(n)]  # type: ignore[misc]


async def test_a_feed_joins_what_is_queued_in_order_up_to_its_take() -> None:
    feed = SubscriberFeed(64 * TAKE_BYTES)
    first, second, third = _changes(1), _changes(2), _changes(1)
    for changes in (first, second, third):
        assert feed.offer(changes, 10)
    assert await feed.get() == [*first, *second, *third]
    assert first == first[:1], "the queued lists are not changed"

    big, after = _changes(1), _changes(1)
    feed.offer(big, TAKE_BYTES)  # as large as a take: alone
    feed.offer(after, 1)
    assert await feed.get() == big
    assert await feed.get() == after
    over, tail = _changes(1), _changes(1)
    feed.offer(over, 2 * TAKE_BYTES)  # larger than a take: still taken, alone
    feed.offer(tail, 1)
    assert await feed.get() == over
    assert await feed.get() == tail
    feed.offer(_changes(1), 1)
    feed.close()
    assert await feed.get() is None


async def test_a_page_ends_before_a_state_for_an_entity_it_already_holds() -> None:
    node = await Node.open(MemoryStorage(), durable=True)
    await node.create_system()
    async with node.context().transaction() as trx:
        a, b = trx.create(Item).id, trx.create(Item).id
    state_a, state_b = await node.storage.get_state(a), await node.storage.get_state(b)
    assert state_a is not None
    assert state_b is not None
    (genesis_a,) = [e.event for e in await node.storage.events_of(a)]
    await node.close()
    events_a = Delta(a, "items", True, None, (genesis_a,))
    snapshot_a = Delta(a, "items", True, state_a, ())
    snapshot_b = Delta(b, "items", True, state_b, ())
    pages = list(serving._pages([events_a, snapshot_b, events_a, snapshot_a, events_a], 1 << 20))
    assert pages == [[events_a, snapshot_b, events_a], [snapshot_a, events_a]]
    assert list(serving._pages([events_a] * 3, 1 << 20)) == [[events_a] * 3]


async def test_a_subscriber_behind_by_several_commits_gets_them_in_one_push() -> None:
    server_node = await Node.open(MemoryStorage(), durable=True)
    await server_node.create_system()
    async with server_node.context().transaction() as trx:
        entity: EntityId = trx.create(Item).id
    server = InProcessServer(server_node)
    client = await Node.open(MemoryStorage(), durable=False)
    server.connect(client)
    try:
        await client.wait_ready(timeout=10)
        served = server_node._responder._served
        update = served.update
        entered, release = asyncio.Event(), asyncio.Event()
        batches: list[int] = []

        async def held(standing: Any, changes: list[EntityChange], *args: Any, **kw: Any) -> Any:
            batches.append(len(changes))
            if len(batches) == 1:
                entered.set()
                await release.wait()  # the first push is slow: the rest queue behind it
            return await update(standing, changes, *args, **kw)

        async with client.context().query(Item, "") as live:
            served.update = held  # type: ignore[method-assign]
            (connection,) = server.connections
            pushed: list[SubscriptionUpdate] = []
            push = connection.push

            def counted(msg: Any) -> None:
                if isinstance(msg, SubscriptionUpdate):
                    pushed.append(msg)
                push(msg)

            connection.push = counted  # type: ignore[method-assign]
            for n in range(1, 7):
                async with server_node.context().transaction() as trx:
                    (await trx.edit(Item, entity)).n = n
                if n == 1:
                    await asyncio.wait_for(entered.wait(), 10)
            release.set()

            async def last_seen() -> bool:
                return [v.n for v in live.items] == [6]

            await until(client, last_seen)
        assert batches == [1, 5], "the five commits queued behind the first: one push"
        assert [sum(len(d.events) for d in u.deltas) for u in pushed] == [1, 5]
    finally:
        await client.close()
        await server.close()
        await server_node.close()
