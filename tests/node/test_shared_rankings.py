"""Subscriptions to one LIMIT query share its ranking while storage is unchanged
(mycelia.node.served): before, a change that made room in the LIMIT re-ranked it from
storage once per subscriber, and each ranking of an ORDER BY the predicate does not
restrict reads the whole collection (10 clients' `ORDER BY n DESC LIMIT 5` over 20,000
rows: 3.7 s for one such change)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest

from mycelia import Model, Node
from mycelia.node.inprocess import InProcessServer
from mycelia.node.live import LiveQuery
from mycelia.proto.query import After, Query
from mycelia.retrieval import StoredState
from mycelia.storage import MemoryStorage

SUBSCRIBERS = 4


class Score(Model, collection="scores"):
    points: int = 0


class Counting(MemoryStorage):
    """MemoryStorage that counts the LIMIT queries it ranks."""

    def __init__(self) -> None:
        super().__init__()
        self.ranked = 0

    async def fetch(
        self, collection: str, query: Query, *, after: After | None = None
    ) -> list[StoredState]:
        if query.limit is not None:
            self.ranked += 1
        return await super().fetch(collection, query, after=after)


Board = tuple[Node, Counting, list[LiveQuery[Score]]]


@pytest.fixture
async def leaderboard() -> AsyncIterator[Board]:
    """A server holding 6 scores, and SUBSCRIBERS clients showing its top 3."""
    storage = Counting()
    async with AsyncExitStack() as stack:
        server_node = await stack.enter_async_context(Node.open(storage, durable=True))
        await server_node.create_system()
        server = InProcessServer(server_node)
        stack.push_async_callback(server.close)
        async with server_node.context().transaction() as trx:
            for points in range(6):
                trx.create(Score, points=points)
        clients = []
        for _ in range(SUBSCRIBERS):
            client = await stack.enter_async_context(Node.open(MemoryStorage(), durable=False))
            server.connect(client)
            await client.wait_ready(timeout=10)
            clients.append(client)
        lives = [c.context().query(Score, "ORDER BY points DESC LIMIT 3") for c in clients]
        opened = await asyncio.gather(*(stack.enter_async_context(live) for live in lives))
        yield server_node, storage, opened


async def shown(lives: list[LiveQuery[Score]], points: list[int]) -> None:
    """Wait until every client's live query shows ``points``, in order."""
    for live in lives:
        changes = aiter(live)
        while [s.points for s in live.items] != points:
            await asyncio.wait_for(anext(changes), 10)


async def test_subscribers_to_one_limit_query_share_its_ranking(leaderboard: Board) -> None:
    server_node, storage, lives = leaderboard
    assert storage.ranked == 1  # the answers, opened at once: storage unchanged between them
    top = lives[0].items[0]
    storage.ranked = 0
    async with server_node.context().transaction() as trx:
        (await trx.edit(Score, top.id)).points = -1  # leaves the LIMIT: storage refills it
    await shown(lives, [4, 3, 2])
    assert storage.ranked == 1  # (before: once per subscriber)


async def test_a_commit_after_a_ranking_is_ranked_again(leaderboard: Board) -> None:
    server_node, storage, lives = leaderboard
    first, second = lives[0].items[:2]
    async with server_node.context().transaction() as trx:
        (await trx.edit(Score, first.id)).points = -1
    await shown(lives, [4, 3, 2])
    async with server_node.context().transaction() as trx:
        (await trx.edit(Score, second.id)).points = -2
        trx.create(Score, points=1)
    await shown(lives, [3, 2, 1])  # (a ranking kept past its commit: 4 would show at -2)
    assert storage.ranked == 3  # the answers', then one per commit
