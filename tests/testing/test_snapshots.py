"""Ephemeral nodes that hold state snapshots without their history (ARCHITECTURE.md §7).

``SimConfig(snapshots=True)`` makes durable nodes catch ephemeral ones up as a server does
(a state for an entity the client lacks, or whose head differs with no bridge), and gives
every ephemeral node its durable peers as a history source (``Applier.remote``). The
simulator found that a snapshot holder could never fill in the history under its head, nor
keep an antichain head over older history; commit 8542f6b fixed both, and these tests keep
them fixed.

It also found that merging a snapshot emitted no change when the entity was new and had
no values, or when only its head moved, so live queries missed it; fixed, kept fixed here.
"""

from __future__ import annotations

from collections.abc import Sequence

from mycelia import Model, Node
from mycelia.proto import AdmittedEvent, Event, EventId
from mycelia.storage import MemoryStorage
from mycelia.testing import (
    SimConfig,
    WatchedQuery,
    check_heads_are_antichains,
    run_seed,
    run_seeds,
)

SNAPSHOTS = SimConfig(durable=3, ephemeral=2, operations=200, snapshots=True, watch=True)


class Note(Model, collection="notes"):
    title: str
    rank: int = 0


class Link(Model, collection="links"):
    weight: float | None


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


async def _ephemeral(peer: Node | None, first: Node) -> Node:
    """An ephemeral node of ``first``'s system, asking ``peer`` (if any) for history."""
    e = await Node.open(MemoryStorage(), durable=False)
    await e.join_system(await first.system_events())
    if peer is not None:

        async def remote(ids: Sequence[EventId], ahead: int) -> list[AdmittedEvent]:
            found = await peer.storage.get_events(ids, ahead=ahead)
            return [
                AdmittedEvent(Event.from_bytes(x.to_bytes()), x.generation) for x in found.values()
            ]

        e.applier.remote = remote
    return e


async def test_a_snapshot_holder_places_a_concurrent_event_once_it_has_the_history() -> None:
    a, b, note = await _fork()
    e = await _ephemeral(None, a)
    state = await a.storage.get_state(note.id)
    assert state is not None
    await e.applier.ingest_states([state])  # the client holds [B] without its events
    concurrent = (await b.storage.events_of(note.id))[-1]
    await e.ingest([concurrent])  # held: its parent A is unknown
    await e.ingest(await a.storage.events_of(note.id))  # the history: G, A, B
    assert (await e.context().get(Note, note.id)).rank == 7


async def test_a_snapshot_over_older_history_keeps_an_antichain_head_with_a_peer() -> None:
    a, b, note = await _fork()
    await a.ingest(await b.storage.events_of(note.id))
    e = await _ephemeral(a, a)
    await e.ingest((await a.storage.events_of(note.id))[:1])  # the genesis only
    state = await a.storage.get_state(note.id)
    assert state is not None
    await e.applier.ingest_states([state])
    await check_heads_are_antichains({"a": a, "e": e})


def test_seeds_with_snapshots_converge() -> None:
    report = run_seeds(range(16), SNAPSHOTS, workers=2)
    report.raise_first()


async def test_a_new_entity_from_a_snapshot_reaches_live_queries() -> None:
    a = await Node.open(MemoryStorage(), durable=True)
    await a.create_system()
    e = await _ephemeral(a, a)
    async with a.context().transaction() as trx:
        link = trx.create(Link)  # no values: every field is None
    watched = await WatchedQuery.open(e.context(), Link, "")
    state = await a.storage.get_state(link.id)
    assert state is not None
    result = await e.applier.ingest_states([state])
    e.notify(result.changes)  # as Connection.apply_deltas does
    await watched.check("e")


def test_the_simulator_with_snapshots_and_live_queries_converges_on_seed_6() -> None:
    run_seed(6, SimConfig(snapshots=True, watch=True), shrink_runs=0)
