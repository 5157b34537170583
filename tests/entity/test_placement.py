"""Placing ingested events against an entity's head (``entity/placement.py``): which
events are placed in O(their parents) and which the walk decides, each with the walk's
answer. Helpers and events as in ``test_applier``."""

from __future__ import annotations

from typing import Any

import pytest

from mycelia.entity import placement as placement_module
from mycelia.errors import EventNotFound
from mycelia.event_dag import missing
from mycelia.proto import Clock, EventId
from tests.entity.test_applier import (
    _applier,
    _edit,
    _holding,
    _note,
    _server,
    _update,
    _with_note,
)


async def test_history_below_a_head_whose_link_is_out_of_reach_is_not_placed_as_new() -> None:
    """A subject-side walk must not stop early while an unavailable event reached from the
    head only could link the subject to it (the simulator's HeadNotAntichain)."""
    a = await _server()
    note = await _note(a, title="g")
    await _edit(a, note, title="a")
    await _edit(a, note, title="x")
    history = await a.storage.events_of(note)  # G, A, X
    applier, _ = await _applier(a, remote=[])  # a peer that answers nothing
    _, held, base = await _holding(applier, a, note)  # head [X], none of its history
    mine = _update(note, held.head, rank=1)
    await applier.commit_local([mine], bases={note: base})  # K on X
    result = await applier.ingest([history[0].event, history[1].event])  # G, A: below X
    assert isinstance(result.errors[note], EventNotFound)
    entity = await applier.load(note)
    assert entity is not None
    assert entity.head == Clock([mine.id])


async def test_an_event_above_the_head_is_placed_without_a_walk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a node that is no durable store (here a cache), an event whose parents are all
    tips, or whose generation no tip exceeds, or (on a cache) that is above every snapshot
    it merged, moves the head in O(their parents). Each gets the walk's answer; below a
    snapshot, the walk decides (the two tests after this one)."""
    walks: list[Clock] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        walks.append(args[1])
        return missing(*args, **kwargs)

    monkeypatch.setattr(placement_module, "missing", counted)
    _, note, applier, _, genesis = await _with_note()
    x = _update(note, genesis.head, title="x")
    y, z = _update(note, Clock([x.id]), rank=1), _update(note, Clock([x.id]), rank=2)
    late = _update(note, genesis.head, rank=3)  # as old as x: below y's generation
    await applier.ingest([x])
    await applier.ingest([y])  # names the head
    await applier.ingest([z])  # names x, which y replaced, but no tip is younger
    await applier.ingest([late])  # older than the tips, but this cache merged no snapshot
    assert walks == []
    entity = await applier.load(note)
    assert entity is not None
    assert entity.head == Clock([y.id, z.id, late.id])
    merge = _update(note, Clock([y.id, z.id, late.id]), title="m")
    await applier.ingest([merge])  # names every tip
    assert (await applier.ingest([merge])).changes == []  # already stored: a no-op
    assert walks == []
    entity = await applier.load(note)
    assert entity is not None
    assert entity.head == Clock([merge.id])
    values = entity.snapshot().values
    assert values["title"] == "m"
    assert values["rank"] == (1 if y.id > z.id else 2)  # the later generation beats late's


async def test_a_cache_places_a_concurrent_event_above_its_snapshot_without_a_walk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A concurrent writer's event older than the head's tips but above the snapshot a
    cache took cannot be in the head's history (that history is what the cache holds and
    what lies below the snapshot): it is placed in O(its parents), with the walk's answer.
    One below the snapshot is still walked (the peer's history decides)."""
    walks: list[Clock] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        walks.append(args[1])
        return missing(*args, **kwargs)

    monkeypatch.setattr(placement_module, "missing", counted)
    a = await _server()
    note = await _note(a, title="g")
    await _edit(a, note, rank=1)
    history = await a.storage.events_of(note)  # G, R
    applier, _ = await _applier(a, remote=history)
    await applier.ingest([history[0].event])  # G, stored here
    _, held, _ = await _holding(applier, a, note)  # then the snapshot at [R]: R's not stored
    x = _update(note, held.head, title="x")
    y = _update(note, Clock([x.id]), title="y")
    c = _update(note, held.head, rank=5)  # concurrent with x, below y's generation
    for event in (x, y, c):
        assert (await applier.ingest([event])).errors == {}
    assert walks == []
    entity = await applier.load(note)
    assert entity is not None
    assert entity.head == Clock([y.id, c.id])
    assert (entity.snapshot().values["title"], entity.snapshot().values["rank"]) == ("y", 5)
    below = _update(note, Clock([history[0].id]), rank=7)  # on G: as old as the snapshot
    assert (await applier.ingest([below])).errors == {}
    assert walks == [Clock([below.id])]
    entity = await applier.load(note)
    assert entity is not None
    assert entity.head == Clock([y.id, c.id, below.id])


async def test_a_cache_admits_an_event_naming_a_snapshot_tip_its_head_left() -> None:
    """A cache never stores the events below a snapshot it took; a concurrent writer's
    event naming the snapshot's tip, once the head moved on, was held and its parent
    asked of the peer (half of all pushes with 200 clients editing at once)."""
    a = await _server()
    note = await _note(a, title="g")
    await _edit(a, note, rank=1)
    asked: list[EventId] = []
    applier, _ = await _applier(a, remote=await a.storage.events_of(note), asked=asked)
    _, held, _ = await _holding(applier, a, note)  # head [S], none of its events
    x, y = _update(note, held.head, title="x"), _update(note, held.head, rank=2)
    await applier.ingest([x])  # the head moves on to [x]
    result = await applier.ingest([y])  # names S, no longer a tip
    assert (result.errors, result.held, asked) == ({}, [], [])
    entity = await applier.load(note)
    assert entity is not None
    assert entity.head == Clock([x.id, y.id])
    assert (entity.snapshot().values["title"], entity.snapshot().values["rank"]) == ("x", 2)


async def test_a_walk_that_needs_the_peer_s_history_still_asks_for_it() -> None:
    a = await _server()
    note = await _note(a, title="g")
    await _edit(a, note, title="a")
    await _edit(a, note, title="x")
    history = await a.storage.events_of(note)  # G, A, X
    asked: list[EventId] = []
    applier, _ = await _applier(a, remote=history, asked=asked)
    _, held, base = await _holding(applier, a, note)  # head [X], none of its history
    mine = _update(note, held.head, rank=1)
    await applier.commit_local([mine], bases={note: base})  # K on X
    result = await applier.ingest([history[0].event, history[1].event])  # G, A: below X
    assert (result.errors, result.held) == ({}, [])  # only X's parents say they are below
    assert asked  # the verdict needed the peer: it was asked
    entity = await applier.load(note)
    assert entity is not None
    assert entity.head == Clock([mine.id])  # A was already in, under X
