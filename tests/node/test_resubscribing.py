"""A reconnecting client reads its live queries' heads from storage in one read a query
(mycelia.node.upstream): before, it made every member resident only to read its head, one
storage read each for those memory had let go, pushing out the entities in use (ten
clients holding 75,000 members between them spent 2.6 s of CPU on it, 0.7 s now)."""

from __future__ import annotations

import asyncio
from collections.abc import Collection

from mycelia import Model, Node
from mycelia.entity.residents import DEFAULT_KEEP
from mycelia.node.inprocess import InProcessServer
from mycelia.proto import EntityId, EntityState
from mycelia.proto.limits import MAX_BATCH_EVENTS
from mycelia.storage import MemoryStorage

MEMBERS = DEFAULT_KEEP + 200  # more than memory keeps: some must come from storage


class Pebble(Model, collection="pebbles"):
    grams: int = 0


class Counting(MemoryStorage):
    """MemoryStorage that counts its state reads, one id or many at a time."""

    def __init__(self) -> None:
        super().__init__()
        self.one_at_a_time = 0
        self.many_at_a_time = 0

    async def get_state(self, entity_id: EntityId) -> EntityState | None:
        self.one_at_a_time += 1
        return await super().get_state(entity_id)

    async def get_states(self, ids: Collection[EntityId]) -> dict[EntityId, EntityState]:
        self.many_at_a_time += 1
        return await super().get_states(ids)


async def test_a_reconnect_reads_the_heads_it_sends_in_one_read_a_query(
    in_process_server: tuple[Node, InProcessServer, Node],
) -> None:
    server_node, server, _ = in_process_server
    async with server_node.context().transaction() as trx:
        for grams in range(MEMBERS):
            trx.create(Pebble, grams=grams)
    storage = Counting()
    async with Node.open(storage, durable=False) as client:
        server.connect(client)
        await client.wait_ready(timeout=10)
        async with client.context().query(Pebble, "grams >= ?", 0) as live:
            assert len(live.items) == MEMBERS
            storage.one_at_a_time = storage.many_at_a_time = 0
            await server.drop()  # the client redials and subscribes again, with its heads
            await client.wait_ready(timeout=10)
            async with server_node.context().transaction() as trx:
                trx.create(Pebble, grams=MEMBERS)
            changes = aiter(live)
            while len(live.items) <= MEMBERS:  # (the new one: the query is mirrored again)
                await anext(changes)
        assert storage.one_at_a_time == 0  # (before: one per member memory had let go)
        assert storage.many_at_a_time >= 1


async def test_a_live_query_past_the_heads_a_peer_decodes_is_mirrored_again(
    in_process_server: tuple[Node, InProcessServer, Node],
) -> None:
    # A peer decodes at most MAX_BATCH_EVENTS known heads: a live query of more members
    # ended on its first reconnect, its subscription refused (PayloadTooLarge).
    server_node, server, client = in_process_server
    async with server_node.context().transaction() as trx:
        for grams in range(MAX_BATCH_EVENTS + 50):
            trx.create(Pebble, grams=grams)
    async with client.context().query(Pebble, "grams >= ?", 0) as live:
        named, unnamed = live.member_ids()[0], live.member_ids()[-1]
        await server.stop()
        for entity_id in (named, unnamed):  # both leave the query while the client is away
            async with server_node.context().transaction() as trx:
                (await trx.edit(Pebble, entity_id)).grams = -1
        server.start()
        changes = aiter(live)
        while len(live.items) > MAX_BATCH_EVENTS + 48:
            await asyncio.wait_for(anext(changes), 10)  # (before: raised PayloadTooLarge)
        assert {named, unnamed}.isdisjoint(live.member_ids())
