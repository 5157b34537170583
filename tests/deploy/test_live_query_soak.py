"""Live queries against a real ``mycelia serve``, at a size no unit test reaches: dozens of
clients each holding LIMIT and range queries while writers edit, readers ``ctx.get``
random rows (rows no query keeps current), and the server is killed with SIGKILL and
restarted halfway. Afterwards every live query must equal a fresh fetch.

Before mycelia.node.kept, LIMIT queries kept showing a row the server had moved, at its
old value, for good: this test failed with 7 of its 120 queries so (and 6 runs of 8 of a
60-client variant, 11 queries of 1,440). Until a server pushed a change merging a
client's commit with a concurrent write that won (mycelia.node.served), about 1 run in 10
failed with a writer's query showing its own write that the server had merged away. Each
failure prints the rows that differ, on both sides. It passes in about 25 s.
"""

from __future__ import annotations

import asyncio
import random
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

import mycelia
from mycelia import Model, Node
from mycelia.errors import MyceliaError
from mycelia.node.live import LiveQuery
from mycelia.proto import EntityId
from mycelia.storage import MemoryStorage
from tests.deploy.servers import Served, start_serve
from tests.node.test_connecting import free_port

ROWS, CLIENTS, WRITERS, EDITS, READS = 2000, 40, 4, 800, 400
QUERIES: list[tuple[str, Callable[[random.Random], tuple[object, ...]]]] = [
    ("n > ? ORDER BY n DESC LIMIT 5", lambda r: (r.randrange(0, 500),)),
    ("n >= ? ORDER BY n LIMIT 7", lambda r: (r.randrange(0, 900),)),
    ("n < ?", lambda r: (r.randrange(0, 100),)),
]


class Score(Model, collection="scores"):
    n: int = 0


async def _client(url: str) -> Node:
    node = await Node.open(MemoryStorage(), durable=False)
    await mycelia.connect(node, url)
    await node.wait_ready(timeout=60)
    return node


async def _mismatched(
    lives: list[tuple[LiveQuery[Score], str, tuple[object, ...]]], truth: Node
) -> list[str]:
    bad = []
    for live, text, args in lives:
        await live.wait_settled()
        want = [(v.id, v.n) for v in await truth.context().fetch(Score, text, *args)]
        got = [(v.id, v.n) for v in live.items]
        if got != want:
            shown = sorted(set(got) - set(want), key=str)[:4]
            fetched = sorted(set(want) - set(got), key=str)[:4]
            bad.append(f"{text} {args}: only the live query shows {shown}, only a fetch {fetched}")
    return bad


async def _until_equal(
    nodes: list[Node], lives: list[tuple[LiveQuery[Score], str, tuple[object, ...]]], truth: Node
) -> list[str]:
    """The live queries that still differ from a fresh fetch after 30 s, re-checked after
    each change any client applies (at most every 2 s without one)."""
    changed = asyncio.Event()
    removers = [node.on_change(lambda _: changed.set()) for node in nodes]
    try:
        async with asyncio.timeout(30):
            while await _mismatched(lives, truth):
                changed.clear()
                try:
                    async with asyncio.timeout(2):
                        await changed.wait()
                except TimeoutError:
                    pass  # nothing changed: check once more
    except TimeoutError:
        pass
    finally:
        for remove in removers:
            remove()
    return await _mismatched(lives, truth)


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.timeout(900)
async def test_live_queries_equal_a_fresh_fetch_after_stale_reads_and_a_kill(
    tmp_path: Path,
) -> None:
    rng = random.Random(5)
    port = free_port()
    served: Served = start_serve(tmp_path, "--port", str(port))
    url = served.url
    seeder = await _client(url)
    async with seeder.context().transaction() as trx:
        ids = [trx.create(Score, n=rng.randrange(0, 1000)).id for _ in range(ROWS)]
    clients = [await _client(url) for _ in range(CLIENTS)]
    lives = []
    for node in clients:
        for text, make in QUERIES:
            args = make(rng)
            lives.append((await node.context().query(Score, text, *args).__aenter__(), text, args))
    halfway = asyncio.Event()

    async def write(node: Node, r: random.Random) -> None:
        for done in range(EDITS):
            if done == EDITS // 2:
                halfway.set()
            try:
                async with node.context().transaction() as trx:
                    (await trx.edit(Score, r.choice(ids))).n = r.randrange(-50, 1000)
            except MyceliaError:
                await node.wait_ready(timeout=60)  # (the server is down: it comes back)

    async def read(node: Node, r: random.Random) -> None:
        for _ in range(READS):
            entity_id: EntityId = r.choice(ids)
            try:
                await node.context().get(Score, entity_id)  # a row no query may keep
            except MyceliaError:
                await node.wait_ready(timeout=60)

    async def kill() -> None:
        nonlocal served
        await halfway.wait()
        await asyncio.to_thread(served.stop, signal.SIGKILL)
        served = await asyncio.to_thread(start_serve, tmp_path, "--port", str(port))

    try:
        await asyncio.gather(
            *(write(clients[w], random.Random(w)) for w in range(WRITERS)),
            *(read(clients[i], random.Random(i)) for i in range(WRITERS, CLIENTS)),
            kill(),
        )
        for node in clients:
            await node.wait_ready(timeout=60)
        truth = await _client(url)
        assert await _until_equal(clients, lives, truth) == []
        await truth.close()
    finally:
        for node in (*clients, seeder):
            await node.close()
        served.stop()
