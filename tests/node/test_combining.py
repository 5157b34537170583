"""Peers' commits combined (:mod:`mycelia.node.combining`): those that arrive while a write
is in flight go in the next run, one storage write for all; one peer's refusal is never
another's. Clients are real nodes served in process; the server's storage is a real
MemoryStorage whose first write is held until the other commits have arrived
(:class:`HeldServer`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine, Iterable
from typing import Any

import pytest

from mycelia import Model, Node
from mycelia.errors import PolicyDenied
from mycelia.node import combining
from mycelia.node.combining import CommitCombiner
from mycelia.node.inprocess import InProcessServer
from mycelia.proto import EntityId
from mycelia.retrieval import WriteBatch, WriteResult
from mycelia.storage import MemoryStorage


class Doc(Model, collection="docs"):
    title: str = ""


class HeldServer:
    """From :meth:`start` on, the served node's storage writes, counted, the first held
    until :meth:`release`; and the commits reaching its combiner, counted."""

    def __init__(self, served: InProcessServer, monkeypatch: pytest.MonkeyPatch) -> None:
        self.storage = served.node.storage
        self.batches: list[WriteBatch] = []
        self._gate = asyncio.Event()
        self._arrived = 0
        self._expected = 0
        self._arriving = asyncio.Event()
        self._started = False
        write, commit = self.storage.write, CommitCombiner.commit

        async def held_write(batch: WriteBatch) -> WriteResult:
            if self._started:
                self.batches.append(batch)
                if len(self.batches) == 1:
                    await self._gate.wait()
            return await write(batch)

        async def counted_commit(combiner: CommitCombiner, *args: Any) -> Any:
            if self._started:
                self._arrived += 1
                self._arriving.set()
            return await commit(combiner, *args)

        monkeypatch.setattr(self.storage, "write", held_write)
        monkeypatch.setattr(CommitCombiner, "commit", counted_commit)

    async def start(self, edits: Iterable[Coroutine[Any, Any, None]]) -> list[asyncio.Task[None]]:
        """Start ``edits`` and wait until each commit reached the server: the first one's
        write is held, so the rest wait for it (a second call adds to the first's)."""
        self._started = True
        started = [asyncio.create_task(edit) for edit in edits]
        self._expected += len(started)
        async with asyncio.timeout(10):
            while self._arrived < self._expected:
                self._arriving.clear()
                await self._arriving.wait()
        return started

    def release(self) -> None:
        self._gate.set()


@pytest.fixture
def held(served: InProcessServer, monkeypatch: pytest.MonkeyPatch) -> HeldServer:
    return HeldServer(served, monkeypatch)


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
    served: InProcessServer, clients: list[Node], held: HeldServer
) -> None:
    doc = await _shared_doc(clients)
    heard: list[int] = []
    served.node.on_change(lambda changes: heard.append(len(changes)))

    edits = await held.start(_retitle(n, doc, f"t{i}") for i, n in enumerate(clients))
    held.release()
    await asyncio.gather(*edits)

    assert len(held.batches) == 2, "the first alone, the three that waited in one write"
    assert len(held.batches[1].events) == 3
    assert heard == [1, 1, 1, 1], "listeners hear of each peer's commit apart"
    assert len(await held.storage.events_of(doc)) == 1 + len(clients)
    titles = {(await n.context().get(Doc, doc)).title for n in clients}
    assert len(titles) == 1  # every client reads the same winner


@pytest.mark.parametrize(
    ("refused_at", "writes"),  # where the refused commit arrives; each write's events
    [(0, [1, 2]), (1, [1, 1, 1]), (2, [1, 2])],
)
async def test_a_refused_commit_in_a_combined_run_is_refused_to_its_peer_only(
    clients: list[Node], held: HeldServer, refused_at: int, writes: list[int]
) -> None:
    doc, aside = await _shared_doc(clients), await _shared_doc(clients)
    async with clients[0].context().transaction() as trx:
        own = trx.create(Doc, title="mine").id  # refused alone: "refused" wins its LWW

    # The lead's write, held, is on an entity of its own: a server read of an entity waits
    # for the writes in flight on it, and the others' transactions read theirs first.
    lead = await held.start([_retitle(clients[0], aside, "lead")])
    targets = [(doc, "fine"), (doc, "also fine")]
    targets.insert(refused_at, (own, "refused"))
    rest = []
    for node, (entity, title) in zip(clients[1:], targets, strict=True):
        rest += await held.start([_retitle(node, entity, title)])  # arriving in this order
    held.release()
    outcomes = await asyncio.gather(*lead, *rest, return_exceptions=True)

    verdicts: list[type] = [type(None)] * 4
    verdicts[1 + refused_at] = PolicyDenied
    assert [type(o) for o in outcomes] == verdicts
    assert len(await held.storage.events_of(doc)) == 1 + 2
    assert len(await held.storage.events_of(own)) == 1, "the refused commit left nothing"
    # The combined run wrote nothing; those before the refused one went in one write,
    # those after it in the next.
    assert [len(batch.events) for batch in held.batches] == writes
    assert (await clients[0].context().get(Doc, own)).title == "mine"


async def test_a_peer_that_leaves_while_its_commit_waits_takes_no_other_commit_with_it(
    clients: list[Node], held: HeldServer
) -> None:
    doc = await _shared_doc(clients)
    edits = await held.start(_retitle(n, doc, f"t{i}") for i, n in enumerate(clients))
    await clients[3].close()  # its commit waits on the server: its connection ends
    held.release()
    outcomes = await asyncio.gather(*edits, return_exceptions=True)

    assert outcomes[:3] == [None, None, None]
    assert len(held.batches) == 2, "those still waiting went in one write"
    assert len(await held.storage.events_of(doc)) >= 1 + 3  # (the server may take the last one)
    titles = {(await n.context().get(Doc, doc)).title for n in clients[:3]}
    assert len(titles) == 1


async def test_a_combined_run_takes_at_most_its_cap_of_events_and_the_rest_go_next(
    clients: list[Node], held: HeldServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(combining, "COMBINED_EVENTS", 2)
    doc = await _shared_doc(clients)
    edits = await held.start(_retitle(n, doc, f"t{i}") for i, n in enumerate(clients))
    held.release()
    await asyncio.gather(*edits)

    assert [len(batch.events) for batch in held.batches] == [1, 2, 1]
