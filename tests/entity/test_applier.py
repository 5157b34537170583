"""The applier on its own: MemoryStorage, no Node (ARCHITECTURE.md §5).

Events are made by a durable node (the easiest way to mint real ones); the applier under
test is built directly, as the node's composition root builds it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from mycelia import Model, Node
from mycelia.entity import (
    Applier,
    Entity,
    EntityChange,
    ForkBase,
    PendingPool,
    Residents,
    Snapshot,
)
from mycelia.entity.unsure import UNSURE_PREFIX
from mycelia.entity.values import encode_value
from mycelia.errors import CommitReverted, DecodeError, PolicyDenied, StorageError
from mycelia.event_dag import DEFAULT_BUDGET
from mycelia.proto import AdmittedEvent, Clock, EntityId, EntityState, Event, EventId
from mycelia.proto.codec import pack
from mycelia.retrieval import WriteBatch
from mycelia.storage import MemoryStorage
from mycelia.storage.testing import engine_content


class Note(Model, collection="notes"):
    title: str = ""
    rank: int = 0


async def _server() -> Node:
    node = await Node.open(MemoryStorage(), durable=True)
    await node.create_system()
    return node


async def _note(node: Node, **values: Any) -> EntityId:
    async with node.context().transaction() as trx:
        return trx.create(Note, **values).id


async def _edit(node: Node, entity_id: EntityId, **values: Any) -> None:
    async with node.context().transaction() as trx:
        handle = await trx.edit(Note, entity_id)
        for name, value in values.items():
            setattr(handle, name, value)


async def _applier(
    server: Node,
    *,
    durable: bool = False,
    heard: list[EntityChange] | None = None,
    remote: Sequence[AdmittedEvent] | None = None,
    asked: list[EventId] | None = None,
    residents: Residents | None = None,
    store: MemoryStorage | None = None,
    gate: asyncio.Event | None = None,
    asking: asyncio.Event | None = None,
    budget: int = DEFAULT_BUDGET,
) -> tuple[Applier, MemoryStorage]:
    """An applier of ``server``'s system on a fresh store, or on ``store`` as after a
    restart (``remote``: the history a peer would answer with, ``asked`` collects what it
    was asked for; None: no peer; ``gate``: the peer answers only while it is set;
    ``asking``: set once the peer is asked)."""
    store = MemoryStorage() if store is None else store

    async def ask(ids: Sequence[EventId], ahead: int) -> list[AdmittedEvent]:
        if asked is not None:
            asked.extend(ids)
        if asking is not None:
            asking.set()
        if gate is not None:
            await gate.wait()
        return [e for e in remote or () if e.id in ids]

    root = server.system_root
    applier = Applier(
        store,
        Residents() if residents is None else residents,
        durable=durable,
        system_root=lambda: root,
        remote=None if remote is None else ask,
        on_change=None if heard is None else heard.extend,
        pending=PendingPool(),
        budget=budget,
    )
    await applier.ingest([e.event for e in await server.system_events()])
    return applier, store


async def _with_note(
    *, durable: bool = False
) -> tuple[Node, EntityId, Applier, MemoryStorage, Entity]:
    """A server with one note, and an applier (on a fresh store) that holds the note's
    events: the server, the note, the applier, its store and the entity it holds."""
    a = await _server()
    note = await _note(a, title="g")
    applier, store = await _applier(a, durable=durable)
    await applier.ingest([e.event for e in await a.storage.events_of(note)])
    held = await applier.load(note)
    assert held is not None
    return a, note, applier, store, held


async def _holding(
    applier: Applier, server: Node, note: EntityId
) -> tuple[EntityState, Entity, ForkBase]:
    """Give ``applier`` the server's state of ``note`` as a snapshot (no events); returns
    the state, the entity held and what a fork of it starts from."""
    state = await server.storage.get_state(note)
    assert state is not None
    await applier.ingest_states([state])
    held = await applier.load(note)
    assert held is not None
    return state, held, applier.base(held)


def _update(entity_id: EntityId, parent: Clock, **values: Any) -> Event:
    """An update setting LWW ``values`` on ``parent`` (as a transaction's fork would)."""
    draft = Entity.empty(entity_id, "notes")
    for name, value in values.items():
        draft.lww().set(name, encode_value(value))
    return Event.update(
        entity_id=entity_id, collection="notes", parent=parent, operations=draft.take_operations()
    )


async def test_a_snapshot_base_is_taken_only_while_the_head_is_exactly_that_base() -> None:
    a = await _server()
    note = await _note(a, title="g")
    states: list[EntityState] = []
    for rank in (1, 2, 3):
        await _edit(a, note, rank=rank)
        state = await a.storage.get_state(note)
        assert state is not None
        states.append(state)
    first, second, third = states
    for base, width in ((first.state.head, 1), (second.state.head, 2)):
        applier, _ = await _applier(a, durable=True)
        await applier.ingest_states([first])
        await applier.ingest_states([third], bases={note: base})
        entity = await applier.load(note)
        assert entity is not None
        assert entity.snapshot().values["rank"] == 3
        # A base that is not the head here is ignored: with no history to compare, a
        # durable node keeps both heads (the usual fallback), never one it cannot justify.
        assert len(entity.head) == width


async def test_tidy_asks_the_peer_outside_the_lock_and_keeps_a_mark_made_meanwhile() -> None:
    a = await _server()
    note = await _note(a, title="g")
    history: list[AdmittedEvent] = []
    gate, asking = asyncio.Event(), asyncio.Event()
    gate.set()
    applier, store, mine, _, base = await _made_elsewhere_too(
        a, note, history, gate=gate, asking=asking
    )
    await applier.commit_local([mine], bases={note: base})
    gate.clear()  # the peer is slow to answer
    asking.clear()
    tidying = asyncio.ensure_future(applier.unsure.tidy())
    await asyncio.wait_for(asking.wait(), 10)
    # A commit meanwhile does not wait for the peer, and marks the head again.
    entity = await applier.load(note)
    assert entity is not None
    fork, forked = applier.base(entity), entity.head
    for rank in (2, 3):
        await _edit(a, note, rank=rank)
    newer = await a.storage.get_state(note)
    assert newer is not None
    try:
        async with asyncio.timeout(5):  # (the entity's lock is free while tidy() waits)
            await applier.ingest_states([newer], bases={note: forked})
            await applier.commit_local([_update(note, forked, title="x")], bases={note: fork})
    finally:
        gate.set()
        await tidying
    marked = bool(applier.unsure)  # the later mark stands: the next call settles its head
    assert marked
    assert len(await store.scan_meta(UNSURE_PREFIX)) == 1
    history += await a.storage.events_of(note)
    await applier.unsure.tidy()
    assert not bool(applier.unsure)
    assert await store.scan_meta(UNSURE_PREFIX) == []


@pytest.mark.parametrize("peer", [False, True], ids=["no peer", "a peer to tidy with"])
async def test_a_local_commit_forked_before_a_snapshot_moved_the_head_is_placed(
    peer: bool,
) -> None:
    """The race of the client-side issue, at the applier: the fork's head is replaced by a
    snapshot whose history this node never held; the commit still lands, beside it (and
    stays there once the head is tidied: the peer's history shows the two concurrent)."""
    a = await _server()
    note = await _note(a, title="g")
    history: list[AdmittedEvent] = []
    applier, _ = await _applier(a, remote=history if peer else None)
    _, held, base = await _holding(applier, a, note)
    mine = _update(note, held.head, title="mine")
    for i in range(3):
        await _edit(a, note, rank=i + 1)
    later = await a.storage.get_state(note)
    assert later is not None
    await applier.ingest_states([later], bases={note: held.head})  # the fork's head is gone
    history += await a.storage.events_of(note)
    result = await applier.commit_local([mine], bases={note: base})
    assert bool(applier.unsure) is peer
    await applier.unsure.tidy()
    assert not bool(applier.unsure)
    entity = await applier.load(note)
    assert entity is not None
    assert [e.id for e in result.stored] == [mine.id]
    assert set(entity.head) == set(later.state.head) | {mine.id}  # concurrent: both tips
    assert entity.snapshot().values["title"] == "mine"
    assert entity.snapshot().values["rank"] == 3


async def _made_elsewhere_too(
    a: Node,
    note: EntityId,
    history: list[AdmittedEvent],
    *,
    gate: asyncio.Event | None = None,
    asking: asyncio.Event | None = None,
) -> tuple[Applier, MemoryStorage, Event, EntityState, ForkBase]:
    """An ephemeral applier forks ``note``; the server makes the very same edit on the same
    head (the same event, content-addressed) and builds on it, and the applier merges that
    snapshot before it commits. Returns the applier, its store, the edit, the snapshot and
    the fork's base (``history``: what the peer answers, filled in here; ``gate`` and
    ``asking`` as for :func:`_applier`)."""
    applier, store = await _applier(a, remote=history, gate=gate, asking=asking)
    _, held, base = await _holding(applier, a, note)
    mine = _update(note, held.head, title="same")
    await a.ingest([mine])
    await _edit(a, note, rank=1)
    later = await a.storage.get_state(note)
    assert later is not None
    await applier.ingest_states([later], bases={note: held.head})
    history += await a.storage.events_of(note)
    return applier, store, mine, later, base


async def test_the_same_edit_made_elsewhere_below_a_merged_head_is_tidied_away() -> None:
    """A fresh event is new content, not always a new event: the server made the same edit
    on the same head, and the snapshot merged since the fork descends from it. The commit
    marks the head unsure (durably); tidy() asks the peer and drops the ancestor tip."""
    a = await _server()
    note = await _note(a, title="g")
    history: list[AdmittedEvent] = []
    applier, store, mine, later, base = await _made_elsewhere_too(a, note, history)
    await applier.commit_local([mine], bases={note: base})
    marked = bool(applier.unsure)
    assert marked
    assert [key for key, _ in await store.scan_meta(UNSURE_PREFIX)] == [
        f"{UNSURE_PREFIX}{note.to_base64()}"
    ]
    await applier.unsure.tidy()
    assert not bool(applier.unsure)
    assert await store.scan_meta(UNSURE_PREFIX) == []
    stored = await store.get_state(note)
    assert stored is not None
    assert stored.state.head == later.state.head  # the tip below it is gone
    assert stored.state.buffers == later.state.buffers


async def test_an_unsure_head_stays_marked_while_the_peer_cannot_be_asked() -> None:
    a = await _server()
    note = await _note(a, title="g")
    history: list[AdmittedEvent] = []
    applier, store, mine, later, base = await _made_elsewhere_too(a, note, history)
    history.clear()  # the peer is unreachable: it answers nothing
    await applier.commit_local([mine], bases={note: base})
    await applier.unsure.tidy()
    assert bool(applier.unsure)
    assert len(await store.scan_meta(UNSURE_PREFIX)) == 1
    # A restart takes the mark up from its record, and tidies once the peer answers.
    history += await a.storage.events_of(note)
    again, _ = await _applier(a, remote=history, store=store)
    again.unsure.keep([note])  # as the node does from the records (Outbox.unsure)
    await again.unsure.tidy()
    stored = await store.get_state(note)
    assert stored is not None
    assert stored.state.head == later.state.head
    assert await store.scan_meta(UNSURE_PREFIX) == []


async def test_an_unsure_head_too_long_to_walk_keeps_its_mark_and_is_not_walked_again() -> None:
    """The walk that tidies a head ends at the budget: what it could not decide is not
    taken as decided (the stale tip stayed, its mark was dropped); the head stays unsure,
    is not walked again in this run, and a start with room for the walk tidies it."""
    a = await _server()
    note = await _note(a, title="g")
    history: list[AdmittedEvent] = []
    asked: list[EventId] = []
    applier, store = await _applier(a, remote=history, asked=asked, budget=2)
    _, held, base = await _holding(applier, a, note)
    mine = _update(note, held.head, title="same")
    await a.ingest([mine])
    for rank in range(1, 6):  # the snapshot's head is five generations above the edit
        await _edit(a, note, rank=rank)
    later = await a.storage.get_state(note)
    assert later is not None
    await applier.ingest_states([later], bases={note: held.head})
    history += await a.storage.events_of(note)
    await applier.commit_local([mine], bases={note: base})
    await applier.unsure.tidy()
    assert bool(applier.unsure)
    assert len(await store.scan_meta(UNSURE_PREFIX)) == 1
    walked = len(asked)
    await applier.unsure.tidy()
    assert len(asked) == walked  # not walked again
    again, _ = await _applier(a, remote=history, store=store)
    again.unsure.keep([note])
    await again.unsure.tidy()
    stored = await store.get_state(note)
    assert stored is not None
    assert stored.state.head == later.state.head
    assert await store.scan_meta(UNSURE_PREFIX) == []


async def test_a_commit_forked_before_a_reset_of_its_entity_is_refused() -> None:
    a = await _server()
    note = await _note(a, title="g")
    applier, store = await _applier(a)
    state, held, base = await _holding(applier, a, note)
    await applier.reset({note: state})
    before = await engine_content(store)
    with pytest.raises(CommitReverted):
        await applier.commit_local([_update(note, held.head, rank=9)], bases={note: base})
    assert await engine_content(store) == before


async def test_a_refusing_check_leaves_nothing_in_memory_or_storage() -> None:
    _, note, applier, store, held = await _with_note(durable=True)
    before = await engine_content(store)

    def refuse(before: Snapshot, after: Snapshot, event: AdmittedEvent) -> None:
        raise PolicyDenied("no")

    with pytest.raises(PolicyDenied):
        await applier.commit_local(
            [_update(note, held.head, rank=5)], bases={note: applier.base(held)}, check=refuse
        )
    assert await engine_content(store) == before
    reloaded = await applier.load(note)
    assert reloaded is not None
    assert reloaded.snapshot().values["rank"] == 0  # memory was not left ahead of storage


async def test_listeners_hear_of_each_write_in_commit_order() -> None:
    a = await _server()
    note = await _note(a, title="g")
    for rank in (1, 2, 3):
        await _edit(a, note, rank=rank)
    heard: list[EntityChange] = []
    applier, _ = await _applier(a, durable=True, heard=heard)
    heard.clear()  # (the system root's own arrival)
    history = [e.event for e in await a.storage.events_of(note)]  # G, 1, 2, 3
    await applier.ingest(history[2:])  # held: their parents are unknown
    await applier.ingest(history[:2])  # G and 1, then each released one in its own write
    assert [c.after.values.get("rank") for c in heard] == [1, 2, 3]
    assert [c.after.head for c in heard] == [Clock([e.id]) for e in history[1:]]


async def test_a_pushed_edit_on_the_held_head_reads_no_stored_event_and_a_resent_one_is_a_no_op(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A subscriber's live edit names the head it holds: the head gives the parents'
    # generations, so only the event's own id is looked up (reading a parent decodes it).
    _, note, applier, store, held = await _with_note()
    asked: list[set[EventId]] = []
    get_events = store.get_events

    async def counted(ids: Any, **kwargs: Any) -> Any:
        asked.append(set(ids))
        return await get_events(ids, **kwargs)

    monkeypatch.setattr(store, "get_events", counted)
    genesis_head, generation = held.head, held.top_generation  # (the resident moves on)
    first = _update(note, genesis_head, title="one")
    result = await applier.ingest([first])
    assert [e.id for e in result.stored] == [first.id]
    assert asked == [{first.id}], "the head's parent is not read"
    assert (await get_events([first.id]))[first.id].generation == generation + 1

    asked.clear()
    before = await engine_content(store)
    assert (await applier.ingest([first])).stored == [], "already here: a no-op"
    assert await engine_content(store) == before
    assert asked == [{first.id} | set(first.parent)], "no longer on the head: looked up"

    beside = _update(note, genesis_head, rank=3)  # beside the first: its parent left the head
    asked.clear()
    result = await applier.ingest([beside])
    assert [e.id for e in result.stored] == [beside.id]
    assert asked[0] == {beside.id, *beside.parent}
    entity = await applier.load(note)
    assert entity is not None
    assert entity.head == Clock([first.id, beside.id])
    assert entity.snapshot().values == {"title": "one", "rank": 3}


async def test_a_reset_replaces_an_entity_and_replays_the_kept_local_commits() -> None:
    a = await _server()
    note = await _note(a, title="g")
    applier, store = await _applier(a)
    state, held, base = await _holding(applier, a, note)
    refused = _update(note, held.head, title="refused")
    await applier.commit_local([refused], bases={note: base})
    kept = AdmittedEvent(_update(note, state.state.head, rank=4), 2)  # forked before it
    result = await applier.reset({note: state}, replay=[kept])
    entity = await applier.load(note)
    assert entity is not None
    assert entity.snapshot().values["title"] == "g"
    assert entity.snapshot().values["rank"] == 4
    assert entity.head == Clock([kept.id])
    assert {e.id for e in await store.events_of(note)} == {kept.id}  # the refused one is gone
    assert [c.after.head for c in result.changes] == [Clock([kept.id])]


async def test_an_event_whose_diff_names_no_property_is_refused_typed() -> None:
    """Hostile input: a diff whose property is a list raised TypeError out of ingest."""
    _, note, applier, store, held = await _with_note(durable=True)
    bad = Event.update(
        entity_id=note,
        collection="notes",
        parent=held.head,
        operations={"lww": [pack([[[1], b"\x01"]])]},
    )
    result = await applier.ingest([bad])
    assert isinstance(result.errors[note], DecodeError)
    assert await store.get_events([bad.id]) == {}


async def test_forgetting_an_entity_in_a_write_drops_it_whole() -> None:
    _, note, _, store, _ = await _with_note(durable=True)
    await store.write(WriteBatch(forget=(note,)))
    assert await store.get_state(note) is None
    assert await store.events_of(note) == []


async def _write_held(
    store: MemoryStorage, monkeypatch: pytest.MonkeyPatch, *, fail: bool
) -> tuple[asyncio.Event, asyncio.Event]:
    """Make the store's next write wait for the returned ``release`` (``writing`` is set
    once it waits), then write, or fail with a StorageError."""
    writing, release = asyncio.Event(), asyncio.Event()
    write = store.write

    async def held(batch: WriteBatch) -> Any:
        writing.set()
        await release.wait()
        if fail:
            raise StorageError("the disk is full")
        return await write(batch)

    monkeypatch.setattr(store, "write", held)
    return writing, release


@pytest.mark.parametrize("fail", [False, True])
async def test_a_peer_is_told_of_an_entity_only_as_written(
    monkeypatch: pytest.MonkeyPatch, fail: bool
) -> None:
    a, note, applier, store, _ = await _with_note(durable=True)
    head = Clock([(await a.storage.events_of(note))[-1].id])
    writing, release = await _write_held(store, monkeypatch, fail=fail)
    commit = asyncio.ensure_future(applier.commit_many([[_update(note, head, title="new")]]))
    await writing.wait()
    resident = await applier.load(note)
    assert resident is not None
    assert resident.snapshot().values["title"] == "new", "the run's resident is ahead"
    told = asyncio.ensure_future(applier.settled(note))
    for _ in range(5):
        await asyncio.sleep(0)  # (it runs until it waits for the run)
    assert not told.done()
    release.set()
    if fail:
        with pytest.raises(StorageError):
            await commit
    else:
        await commit
    settled = await told
    assert settled is not None
    assert settled.snapshot().values["title"] == ("g" if fail else "new")
