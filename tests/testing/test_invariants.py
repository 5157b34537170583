"""Each invariant checker passes on healthy nodes and names the node, entity and difference
when its invariant is broken (broken on purpose: a planted merge bug, or storage written
behind a node's back — faults injected at the edge)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from mycelia import Model, Node
from mycelia.proto import AdmittedEvent, EntityState, EventId, State
from mycelia.retrieval import StoredState, WriteBatch, WriteResult
from mycelia.storage import MemoryStorage
from mycelia.testing import (
    DanglingReference,
    Divergence,
    ForeignEntity,
    HeadNotAntichain,
    LostCommit,
    MemoryAhead,
    Unconverged,
    broken_lww,
    check_convergence,
    check_heads_are_antichains,
    check_no_dangling_references,
    check_no_lost_commits,
    check_system_membership,
)
from mycelia.testing.invariants import stored_entities


class Note(Model, collection="notes"):
    title: str | None
    rank: int | None


async def _nodes(n: int = 2) -> list[Node]:
    first = await Node.open(MemoryStorage(), durable=True)
    await first.create_system()
    nodes = [first]
    for _ in range(n - 1):
        node = await Node.open(MemoryStorage(), durable=True)
        await node.join_system(await first.system_events())
        nodes.append(node)
    return nodes


async def _concurrent_titles(a: Node, b: Node) -> tuple[Note, list[AdmittedEvent]]:
    """A note created on ``a``, then edited concurrently on ``a`` and ``b``."""
    async with a.context().transaction() as trx:
        note = trx.create(Note, title="base", rank=None)
    await b.ingest(await a.storage.events_of(note.id))
    for node, title in ((a, "from a"), (b, "from b")):
        async with node.context().transaction() as trx:
            (await trx.edit(Note, note.id)).title = title
    return note, [*await a.storage.events_of(note.id), *await b.storage.events_of(note.id)]


async def _stored(node: Node, entity: object) -> StoredState:
    (stored,) = [s for s in await node.storage.scan("notes") if s.state.entity_id == entity]
    return stored


async def test_healthy_nodes_pass_every_checker() -> None:
    a, b = await _nodes()
    note, events = await _concurrent_titles(a, b)
    await a.ingest(events)
    await b.ingest(events)
    nodes = {"a": a, "b": b}
    await check_convergence(nodes, complete=True)
    await check_heads_are_antichains(nodes)
    await check_no_dangling_references(nodes)
    await check_system_membership(nodes)
    await check_no_lost_commits(nodes, {e.id: "test" for e in events})
    assert note.id in await stored_entities(a.storage)
    state = await a.storage.get_state(note.id)
    assert state is not None
    assert len(state.state.head) == 2  # the two concurrent edits


async def test_a_planted_merge_bug_is_reported_as_a_divergence() -> None:
    a, b = await _nodes()
    with broken_lww():
        note, events = await _concurrent_titles(a, b)
        await a.ingest(events)
        await b.ingest(events)
        with pytest.raises(Divergence) as caught:
            await check_convergence({"a": a, "b": b})
    message = str(caught.value)
    assert "node b" in message
    assert str(note.id) in message
    assert "title: 'from " in message


async def test_replicas_that_miss_events_after_quiescence_are_unconverged() -> None:
    a, b = await _nodes()
    _, events = await _concurrent_titles(a, b)
    await a.ingest(events)  # b never hears of a's edit
    await check_convergence([a, b])  # different events: no claim yet
    with pytest.raises(Unconverged, match="node 1"):
        await check_convergence([a, b], complete=True)


async def test_an_acknowledged_commit_missing_from_a_durable_node_is_lost() -> None:
    a, b = await _nodes()
    async with a.context().transaction() as trx:
        note = trx.create(Note, title="x", rank=1)
    events = await a.storage.events_of(note.id)
    with pytest.raises(LostCommit, match="node b"):
        await check_no_lost_commits({"a": a, "b": b}, {events[0].id: "committed by a"})


async def test_a_head_with_an_ancestor_of_another_tip_is_not_an_antichain() -> None:
    (a,) = await _nodes(1)
    async with a.context().transaction() as trx:
        note = trx.create(Note, title="x", rank=1)
    async with a.context().transaction() as trx:
        (await trx.edit(Note, note.id)).rank = 2
    genesis, edit = await a.storage.events_of(note.id)
    stored = await _stored(a, note.id)
    head = {genesis.id: 1, edit.id: 2}
    bad = EntityState(
        note.id, "notes", State.of(head=head, buffers=dict(stored.state.state.buffers))
    )
    await a.storage.write(WriteBatch(states=(replace(stored, state=bad),)))
    with pytest.raises(HeadNotAntichain, match=str(note.id)):
        await check_heads_are_antichains([a])


async def test_a_head_naming_a_missing_event_is_a_dangling_reference() -> None:
    (a,) = await _nodes(1)
    async with a.context().transaction() as trx:
        note = trx.create(Note, title="x", rank=1)
    stored = await _stored(a, note.id)
    head = {EventId(b"\x09" * 32): 2}
    bad = EntityState(
        note.id, "notes", State.of(head=head, buffers=dict(stored.state.state.buffers))
    )
    await a.storage.write(WriteBatch(states=(replace(stored, state=bad),)))
    with pytest.raises(DanglingReference, match="not stored"):
        await check_no_dangling_references({"a": a})


async def test_memory_that_runs_ahead_of_storage_is_reported() -> None:
    (a,) = await _nodes(1)
    async with a.context().transaction() as trx:
        note = trx.create(Note, title="x", rank=1)
    before = await _stored(a, note.id)
    async with a.context().transaction() as trx:
        (await trx.edit(Note, note.id)).rank = 2
    await a.storage.write(WriteBatch(states=(before,)))  # storage loses the edit's state
    with pytest.raises(MemoryAhead, match="node a"):
        await check_convergence({"a": a})


class _GatedStorage(MemoryStorage):
    """MemoryStorage whose writes wait at ``gate`` once one is set (``waiting``: one does)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: asyncio.Event | None = None
        self.waiting = asyncio.Event()

    async def write(self, batch: WriteBatch) -> WriteResult:
        if self.gate is not None:
            self.waiting.set()
            await self.gate.wait()
        return await super().write(batch)


async def test_an_entity_changed_by_a_run_not_yet_written_is_not_ahead() -> None:
    """A run puts its entities in memory before its one write: until the write (or the
    eviction of a failed run) memory leads storage, so a check made then (the simulator's
    checker awaits storage, and other tasks run meanwhile) does not count it. Before, a
    subscription answer being applied on a client tripped MemoryAhead at random."""
    (a,) = await _nodes(1)
    gated = _GatedStorage()
    b = await Node.open(gated, durable=True)
    await b.join_system(await a.system_events())
    async with a.context().transaction() as trx:
        note = trx.create(Note, title="x", rank=1)
    gated.gate = asyncio.Event()
    ingest = asyncio.create_task(b.ingest(await a.storage.events_of(note.id)))
    async with asyncio.timeout(10):
        await gated.waiting.wait()  # the run holds the note in memory, not yet in storage
    assert b.resident_state(note.id) is None
    await check_convergence({"a": a, "b": b})
    gated.gate.set()
    await ingest
    assert b.resident_state(note.id) == (await _stored(b, note.id)).state
    await check_convergence({"a": a, "b": b})


async def test_an_entity_of_another_system_is_foreign() -> None:
    a, stranger = await _nodes(1), await _nodes(1)
    async with stranger[0].context().transaction() as trx:
        note = trx.create(Note, title="elsewhere", rank=None)
    events = await stranger[0].storage.events_of(note.id)
    stored = await _stored(stranger[0], note.id)
    await a[0].storage.write(WriteBatch(events=tuple(events), states=(stored,)))  # smuggled in
    with pytest.raises(ForeignEntity, match="created in system"):
        await check_system_membership(a)


async def test_caches_are_compared_by_the_head_they_hold() -> None:
    """A cache stores states and no events: two at different heads may only lag (after
    quiescence that is Unconverged), two at one head must hold the same bytes."""
    (a,) = await _nodes(1)
    async with a.context().transaction() as trx:
        note = trx.create(Note, title="x", rank=1)
    older = await _stored(a, note.id)
    async with a.context().transaction() as trx:
        (await trx.edit(Note, note.id)).rank = 2
    newer = await _stored(a, note.id)
    lagging, current, forged = [await Node.open(MemoryStorage(), durable=False) for _ in range(3)]
    await lagging.storage.write(WriteBatch(states=(older,)))
    await current.storage.write(WriteBatch(states=(newer,)))
    caches = {"lagging": lagging, "current": current}
    await check_convergence(caches)  # one lags: no claim yet
    with pytest.raises(Unconverged, match="rank: 1 \\(lagging\\) vs 2 \\(current\\)"):
        await check_convergence(caches, complete=True)
    wrong = EntityState(
        note.id,
        "notes",
        State.of(
            head=newer.state.state.head_generations(), buffers=dict(older.state.state.buffers)
        ),
    )
    await forged.storage.write(WriteBatch(states=(replace(newer, state=wrong),)))
    with pytest.raises(Divergence, match=r"hold the same head .* but differ: rank: 2"):
        await check_convergence({"current": current, "forged": forged})


async def test_a_cache_s_tombstone_is_only_held_to_being_deleted() -> None:
    """Once deleted, an entity leaves every read path and subscription, so a cache that saw
    the delete is never sent an edit concurrent with it; two caches holding the delete's
    event may then hold different tombstones (a durable node may not)."""
    a, b = await _nodes()
    async with a.context().transaction() as trx:
        note = trx.create(Note, title="base", rank=None)
    await b.ingest(await a.storage.events_of(note.id))
    async with a.context().transaction() as trx:
        await trx.delete(Note, note.id)
    (deletion,) = [e for e in await a.storage.events_of(note.id) if e.generation == 2]
    seen_delete = await _stored(a, note.id)
    async with b.context().transaction() as trx:
        (await trx.edit(Note, note.id)).title = "concurrent"
    await a.ingest(await b.storage.events_of(note.id))
    seen_both = await _stored(a, note.id)
    assert seen_both.state.state.head != seen_delete.state.state.head
    caches = [await Node.open(MemoryStorage(), durable=False) for _ in range(2)]
    for cache, stored in zip(caches, (seen_delete, seen_both), strict=True):
        await cache.storage.write(WriteBatch(events=(deletion,), states=(stored,)))
    await check_convergence({"saw the delete": caches[0], "saw both": caches[1]})
    forged = await Node.open(MemoryStorage(), durable=True)
    await forged.storage.write(WriteBatch(events=(deletion,), states=(seen_delete,)))
    durable = await Node.open(MemoryStorage(), durable=True)
    await durable.storage.write(WriteBatch(events=(deletion,), states=(seen_both,)))
    with pytest.raises(Divergence, match="hold the same 1 events but differ"):
        await check_convergence({"durable": durable, "forged": forged})
