"""A durable peer's snapshots adopted by the applier (``Applier.ingest_states``): stored as
sent by a cache, canonically by a durable node, values decoded once, malformed ones
refused. Helpers and events as in ``test_applier``."""

from __future__ import annotations

from typing import Any, cast

import pytest

from mycelia.entity import Entity, EntityChange, Residents
from mycelia.errors import DecodeError
from mycelia.proto import EntityState, State
from mycelia.proto.codec import pack, unpack
from tests.entity.test_applier import _applier, _note, _server


def _shuffled(state: EntityState) -> EntityState:
    """``state`` with its LWW rows in reverse order: valid, not canonical."""
    ((name, buffer),) = state.state.buffers
    version, rows = cast(list[Any], unpack(buffer))
    wire = pack([version, rows[::-1]])
    return EntityState(
        state.entity_id,
        state.collection,
        State(state.state.head, state.state.generations, ((name, wire),)),
    )


@pytest.mark.parametrize("durable", [False, True], ids=["cache", "durable"])
async def test_an_adopted_snapshot_is_stored_as_sent_only_by_a_cache(durable: bool) -> None:
    """A cache trusts its durable peer's states, so it stores one as sent, without encoding
    it again (a fresh client adopts a thousand at once); a durable node stores the
    canonical encoding of a state it did not have, whatever the sender's bytes were."""
    a = await _server()
    note = await _note(a, title="g", rank=3)
    canonical = await a.storage.get_state(note)
    assert canonical is not None
    sent = _shuffled(canonical)
    assert sent.state.buffers != canonical.state.buffers
    applier, store = await _applier(a, durable=durable)
    await applier.ingest_states([sent])
    stored = await store.get_state(note)
    assert stored == (canonical if durable else sent)
    held = await applier.load(note)
    assert held is not None
    assert held.snapshot().values == {"title": "g", "rank": 3}


async def test_a_cache_adopts_a_snapshot_of_values_without_building_the_entity() -> None:
    """A fresh client adopts a thousand snapshots at once and edits a few: an LWW-only
    state is stored and reported with its values decoded once, and no entity is made
    resident; the first load builds it from storage, its tips kept as a snapshot's."""
    a = await _server()
    note = await _note(a, title="g", rank=3)
    state = await a.storage.get_state(note)
    assert state is not None
    heard: list[EntityChange] = []
    residents = Residents()
    applier, store = await _applier(a, heard=heard, residents=residents)
    before = len(residents)
    heard.clear()  # (the system's own entities)
    await applier.ingest_states([state])
    assert len(residents) == before
    assert await store.get_state(note) is state
    (change,) = heard
    assert (change.before.exists, dict(change.after.values)) == (False, {"title": "g", "rank": 3})
    assert change.changed == {"title", "rank"}
    entity = await applier.load(note)
    assert entity is not None
    assert len(residents) == before + 1
    assert entity.head == state.state.head
    assert entity.boundary == state.state.head_generations()
    assert entity.snapshot() == change.after


async def test_a_malformed_snapshot_is_refused_by_a_cache_and_nothing_is_stored() -> None:
    a = await _server()
    note = await _note(a, title="g")
    state = await a.storage.get_state(note)
    assert state is not None
    bad = EntityState(
        note, "notes", State(state.state.head, state.state.generations, (("lww", b"\x93"),))
    )
    applier, store = await _applier(a)
    result = await applier.ingest_states([bad])
    assert isinstance(result.errors[note], DecodeError)
    assert await store.get_state(note) is None
    assert await applier.load(note) is None


async def test_a_state_read_as_canonical_is_given_back_until_the_entity_changes() -> None:
    """``from_state(canonical=True)`` gives its state back from ``to_state`` without
    encoding it; once a backend is handed out (an event, a merge, a caller's edit all
    take one) it encodes again, and a fork never carries it."""
    a = await _server()
    note = await _note(a, title="g", rank=3)
    canonical = await a.storage.get_state(note)
    assert canonical is not None
    sent = _shuffled(canonical)
    entity = Entity.from_state(sent, canonical=True)
    assert entity.to_state() is sent
    assert entity.fork().to_state() == canonical
    assert Entity.from_state(sent).to_state() == canonical
    entity.lww()
    assert entity.to_state() == canonical
