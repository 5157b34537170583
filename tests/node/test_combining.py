"""Peers' commits combined (:mod:`mycelia.node.combining`): those that arrive while a write
is in flight go in the next run, one storage write for all; one peer's refusal is never
another's. Clients are real nodes served in process; the server's storage is a real
MemoryStorage whose first write is held until the other commits have arrived."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from mycelia import Model, Node
from mycelia.errors import PolicyDenied
from mycelia.node.combining import CommitCombiner
from mycelia.node.inprocess import InProcessServer
from mycelia.proto import EntityId
from mycelia.retrieval import WriteBatch, WriteResult
from mycelia.storage import MemoryStorage


class Doc(Model, collection="docs"):
    title: str = ""


class HeldWrites:
    """The server's storage writes, counted; the first is held until :meth:`release`."""

    def __init__(self, write: Callable[[WriteBatch], Awaitable[WriteResult]]) -> None:
        self._write = write
        self._gate = asyncio.Event()
        self.batches: list[WriteBatch] = []

    async def write(self, batch: WriteBatch) -> WriteResult:
        self.batches.append(batch)
        if len(self.batches) == 1:
            await self._gate.wait()
        return await self._write(batch)

    def release(self) -> None:
        self._gate.set()


class Arrivals:
    """Counts commits reaching the server's combiner; :meth:`reached` waits for a count."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self._changed = asyncio.Event()
        commit = CommitCombiner.commit

        async def counted(combiner: CommitCombiner, *args: Any) -> Any:
            self.count += 1
            self._changed.set()
            return await commit(combiner, *args)

        monkeypatch.setattr(CommitCombiner, "commit", counted)

    async def reached(self, count: int) -> None:
        async with asyncio.timeout(10):
            while self.count < count:
                self._changed.clear()
                await self._changed.wait()


@pytest.fixture
async def clients(served: InProcessServer) -> AsyncIterator[list[Node]]:
    """Four clients of the ``served`` node (whose policy refuses the title ``refused``)."""
    nodes = []
    for _ in range(4):
        node = await Node.open(MemoryStorage(), durable=False)
        served.connect(node)
        await node.wait_ready(timeout=10)
        nodes.append(node)
    yield nodes
    for node in nodes:
        await node.close()


async def _retitle(node: Node, doc: EntityId, title: str) -> None:
    async with node.context().transaction() as trx:  # waits for the server's verdict
        (await trx.edit(Doc, doc)).title = title


async def _shared_doc(clients: list[Node]) -> EntityId:
    async with clients[0].context().transaction() as trx:
        doc = trx.create(Doc, title="first").id
    for node in clients:
        await node.context().get(Doc, doc)
    return doc


async def test_commits_that_arrive_while_a_write_is_in_flight_go_in_one_write(
    served: InProcessServer, clients: list[Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = await _shared_doc(clients)
    storage = served.node.storage
    held = HeldWrites(storage.write)
    monkeypatch.setattr(storage, "write", held.write)
    arrivals = Arrivals(monkeypatch)
    heard: list[int] = []
    served.node.on_change(lambda changes: heard.append(len(changes)))

    edits = [asyncio.ensure_future(_retitle(n, doc, f"t{i}")) for i, n in enumerate(clients)]
    await arrivals.reached(len(clients))  # the first one's write is held: the rest wait
    held.release()
    await asyncio.gather(*edits)

    assert len(held.batches) == 2, "the first alone, the three that waited in one write"
    assert len(held.batches[1].events) == 3
    assert heard == [1, 1, 1, 1], "listeners hear of each peer's commit apart"
    assert len(await storage.events_of(doc)) == 1 + len(clients)
    titles = {(await n.context().get(Doc, doc)).title for n in clients}
    assert len(titles) == 1  # every client reads the same winner


async def test_a_refused_commit_in_a_combined_run_is_refused_to_its_peer_only(
    served: InProcessServer, clients: list[Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = await _shared_doc(clients)
    async with clients[2].context().transaction() as trx:
        own = trx.create(Doc, title="mine").id  # refused alone: "refused" wins its LWW
    storage = served.node.storage
    held = HeldWrites(storage.write)
    monkeypatch.setattr(storage, "write", held.write)
    arrivals = Arrivals(monkeypatch)

    targets = [(doc, "lead"), (doc, "fine"), (own, "refused"), (doc, "also fine")]
    edits = [
        asyncio.ensure_future(_retitle(node, entity, title))
        for node, (entity, title) in zip(clients, targets, strict=True)
    ]
    await arrivals.reached(len(clients))
    held.release()
    outcomes = await asyncio.gather(*edits, return_exceptions=True)

    assert [type(o) for o in outcomes] == [type(None), type(None), PolicyDenied, type(None)]
    assert len(await storage.events_of(doc)) == 1 + 3
    assert len(await storage.events_of(own)) == 1, "the refused commit left nothing"
    assert len(held.batches) == 1 + 2, "the combined run wrote nothing; each alone did"
    assert all(len(batch.events) == 1 for batch in held.batches)
    assert (await clients[0].context().get(Doc, own)).title == "mine"


async def test_a_peer_that_leaves_while_its_commit_waits_takes_no_other_commit_with_it(
    served: InProcessServer, clients: list[Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = await _shared_doc(clients)
    storage = served.node.storage
    held = HeldWrites(storage.write)
    monkeypatch.setattr(storage, "write", held.write)
    arrivals = Arrivals(monkeypatch)

    edits = [asyncio.ensure_future(_retitle(n, doc, f"t{i}")) for i, n in enumerate(clients)]
    await arrivals.reached(len(clients))
    await clients[3].close()  # its commit waits on the server: its connection ends
    held.release()
    outcomes = await asyncio.gather(*edits, return_exceptions=True)

    assert outcomes[:3] == [None, None, None]
    assert len(held.batches) == 2, "those still waiting went in one write"
    assert len(await storage.events_of(doc)) >= 1 + 3  # (the server may take the last one)
    titles = {(await n.context().get(Doc, doc)).title for n in clients[:3]}
    assert len(titles) == 1
