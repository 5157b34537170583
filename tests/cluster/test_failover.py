"""Client failover between servers of one cluster: tried in turn, a dead one left for the
next, live queries re-established, owed and in-flight commits pushed again, nothing
duplicated (ARCHITECTURE.md §7)."""

from __future__ import annotations

import asyncio
import random

import pytest

from mycelia import EntityId, Node
from mycelia.errors import ConnectionClosed
from mycelia.node.failover import Failover
from mycelia.node.inprocess import InProcessServer
from mycelia.node.transport import Transport, memory_pair
from mycelia.storage import MemoryStorage
from tests.cluster.models import Card
from tests.cluster.nodes import create, open_pair
from tests.node.waiting import until
from tests.storage.conftest import PostgresSchemas


async def test_one_call_tries_the_servers_in_turn_starting_after_the_last_one() -> None:
    up = {"a": True, "b": True, "c": True}
    tried: list[str] = []

    async def dial(url: str) -> Transport:
        tried.append(url)
        if not up[url]:
            raise ConnectionRefusedError(url)
        return memory_pair()[0]

    failover = Failover(["a", "b", "c"], dial)
    await failover()
    assert (failover.current, tried) == ("a", ["a"])
    up["b"] = False
    await failover()  # a's session ended: b is next, but it is down
    assert (failover.current, tried[1:]) == ("c", ["b", "c"])
    up["a"] = up["c"] = False
    with pytest.raises(ConnectionClosed, match=r"no server answered: a: .*; b: .*; c: "):
        await failover()
    up["b"] = True
    await failover()
    assert failover.current == "b"


@pytest.mark.postgres
async def test_a_client_fails_over_and_its_live_query_catches_up_with_no_commit_lost_or_doubled(
    pg_schemas: PostgresSchemas,
) -> None:
    a, b, storage, _ = await open_pair(pg_schemas)
    servers = {"a": InProcessServer(a), "b": InProcessServer(b)}
    client = await Node.open(MemoryStorage(), durable=False)
    writer = await Node.open(MemoryStorage(), durable=False)
    try:
        failover = Failover(["a", "b"], lambda name: servers[name]._dial())
        client.attach(
            failover, token=None, min_backoff=0.01, max_backoff=0.2, request_timeout=10,
            rng=random.Random(1),
        ).start()  # fmt: skip
        servers["b"].connect(writer)
        await client.wait_ready(timeout=10)
        await writer.wait_ready(timeout=10)
        assert failover.current == "a"
        mine = await create(client, "mine")
        theirs = await create(writer, "theirs")
        async with client.context().query(Card, "ORDER BY title") as live:
            await until(client, lambda: _titles(live.items, ["mine", "theirs"]))
            pending = []
            for n in range(1, 41):  # pipelined: in flight when server a stops
                trx = client.context().transaction(wait="local")
                async with trx:
                    (await trx.edit(Card, mine)).n = n
                pending.append(trx)
                if n == 20:
                    await servers["a"].stop()
            await _set(writer, theirs, 99)  # through b, while the client fails over
            await asyncio.gather(*(trx.confirmed() for trx in pending))
            assert failover.current == "b"
            await until(client, lambda: _ns(live.items, {"mine": 40, "theirs": 99}))
        assert client.owed() == []
        events = await storage.events_of(mine)
        assert len(events) == 1 + 40, "every commit stored once"
        assert len({e.id for e in events}) == len(events)
        await until(a, lambda: _stored_n(a, mine, 40))  # a's feed saw what b took
    finally:
        await client.close()
        await writer.close()
        for server in servers.values():
            await server.close()
        await a.close()
        await b.close()


async def _set(node: Node, entity: EntityId, n: int) -> None:
    async with node.context().transaction() as trx:
        (await trx.edit(Card, entity)).n = n


async def _titles(items: list[Card], titles: list[str]) -> bool:
    return [c.title for c in items] == titles


async def _ns(items: list[Card], ns: dict[str, int]) -> bool:
    return {c.title: c.n for c in items} == ns


async def _stored_n(node: Node, entity: EntityId, n: int) -> bool:
    return (await node.context().get(Card, entity)).n == n
