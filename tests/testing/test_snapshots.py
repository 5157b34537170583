"""Clients that hold state snapshots without their history (ARCHITECTURE.md §7).

A server answers a client with a snapshot when it is smaller than the events, and the
client fills in the history below it only when it needs it, from its server. The
simulator found that a snapshot holder could never fill in the history under its head,
nor keep an antichain head over older history (fixed in 8542f6b); that merging a snapshot
emitted no change when the entity was new and had no values, or when only its head moved
(fixed then too); and, once it ran the real client code, that the history arriving below
a snapshot's head (its genesis, or a former snapshot head) was taken for new work. These
tests keep all of them fixed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from mycelia import Model, Node
from mycelia.errors import EventNotFound
from mycelia.node.inprocess import InProcessServer
from mycelia.storage import MemoryStorage
from mycelia.testing import (
    Faults,
    SimConfig,
    WatchedQuery,
    check_heads_are_antichains,
    run_seeds,
)


class Note(Model, collection="notes"):
    title: str
    rank: int = 0


class Link(Model, collection="links"):
    weight: float | None = None


async def _fork() -> tuple[Node, Node, Note]:
    """Durable ``a`` at head [B] and ``b`` at [C]: B and C are concurrent on A."""
    a = await Node.open(MemoryStorage(), durable=True)
    await a.create_system()
    b = await Node.open(MemoryStorage(), durable=True)
    await b.join_system(await a.system_events())
    async with a.context().transaction() as trx:
        note = trx.create(Note, title="g")
    async with a.context().transaction() as trx:
        (await trx.edit(Note, note.id)).title = "a"
    await b.ingest(await a.storage.events_of(note.id))
    async with a.context().transaction() as trx:
        (await trx.edit(Note, note.id)).title = "b"
    async with b.context().transaction() as trx:
        (await trx.edit(Note, note.id)).rank = 7
    return a, b, note


@pytest.fixture
async def client_of() -> AsyncIterator[object]:
    """Ephemeral clients of a server, in process (closed at the end)."""
    opened: list[tuple[Node, InProcessServer]] = []

    async def make(server_node: Node) -> Node:
        e = await Node.open(MemoryStorage(), durable=False)
        server = InProcessServer(server_node)
        server.connect(e)
        await e.wait_ready(timeout=10)
        opened.append((e, server))
        return e

    yield make
    for e, server in opened:
        await e.close()
        await server.close()


async def test_a_snapshot_holder_places_a_concurrent_event_once_it_has_the_history() -> None:
    a, b, note = await _fork()
    e = await Node.open(MemoryStorage(), durable=False)  # no server: history comes by ingest
    await e.join_system(await a.system_events())
    state = await a.storage.get_state(note.id)
    assert state is not None
    await e.ingest_states([state])  # the client holds [B] without its events
    concurrent = (await b.storage.events_of(note.id))[-1]
    await e.ingest([concurrent])  # held: its parent A is unknown
    await e.ingest(await a.storage.events_of(note.id))  # the history: G, A, B
    assert (await e.context().get(Note, note.id)).rank == 7
    await check_heads_are_antichains({"a": a, "e": e})


async def test_a_snapshot_over_older_history_keeps_an_antichain_head_with_a_server(
    client_of: object,
) -> None:
    a, b, note = await _fork()
    await a.ingest(await b.storage.events_of(note.id))
    e = await client_of(a)  # type: ignore[operator]
    await e.ingest((await a.storage.events_of(note.id))[:1])  # the genesis only
    state = await a.storage.get_state(note.id)
    assert state is not None
    await e.ingest_states([state])  # walks the history it needs from its server
    await check_heads_are_antichains({"a": a, "e": e})


async def test_history_arriving_below_a_snapshot_head_is_not_taken_for_new_work() -> None:
    a = await Node.open(MemoryStorage(), durable=True)
    await a.create_system()
    async with a.context().transaction() as trx:
        note = trx.create(Note, title="g")
    async with a.context().transaction() as trx:
        (await trx.edit(Note, note.id)).title = "x"
    e = await Node.open(MemoryStorage(), durable=False)
    await e.join_system(await a.system_events())
    state = await a.storage.get_state(note.id)
    assert state is not None
    await e.ingest_states([state])  # head [X], no events
    async with e.context().transaction() as trx:  # K on X
        (await trx.edit(Note, note.id)).rank = 3
    mine = (await e.context().get(Note, note.id)).head
    history = await a.storage.events_of(note.id)
    # The genesis, then X itself: both below K. With no server to show where they sit,
    # the genesis is refused and X waits for it — neither is placed beside K as new work
    # (which made the head [G, K], then [X, K]).
    with pytest.raises(EventNotFound):
        await e.ingest([history[0]])
    held = await e.ingest([history[1]])
    assert held.held == [history[1].id]
    assert (await e.context().get(Note, note.id)).head == mine
    await check_heads_are_antichains({"e": e})


def test_clients_catching_up_by_snapshot_converge() -> None:
    config = SimConfig(durable=1, ephemeral=3, operations=150, faults=Faults.all(), watch=True)
    report = run_seeds(range(12), config, workers=2)
    report.raise_first()


async def test_a_new_entity_from_a_snapshot_reaches_live_queries() -> None:
    a = await Node.open(MemoryStorage(), durable=True)
    await a.create_system()
    e = await Node.open(MemoryStorage(), durable=False)
    await e.join_system(await a.system_events())
    async with a.context().transaction() as trx:
        link = trx.create(Link)  # no values: every field is None
    watched = await WatchedQuery.open(e.context(), Link, "")
    state = await a.storage.get_state(link.id)
    assert state is not None
    await e.ingest_states([state])
    await watched.check("e")
