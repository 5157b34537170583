"""What a responder sends a peer that holds a head (``node/deltas.delta_for``): a bridge
of events while it is smaller than the state, else the state, naming the peer's head as
its base when the state provably descends from it; proved without a walk when the
peer's head is made of events stored here and the state is the one stored after them."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Collection, Mapping
from typing import Any

import pytest

from mycelia import EntityId, Model, Node
from mycelia.node.deltas import delta_for
from mycelia.proto import AdmittedEvent, EntityState, EventId
from mycelia.storage.testing import EngineSpec
from tests.storage.conftest import engine_spec, pg_dsn, pg_schemas


class Tally(Model, collection="tallies"):
    n: int
    note: str


class Counting:
    """A storage engine that counts the events read through it."""

    def __init__(self, storage: Any) -> None:
        self._storage = storage
        self.read = 0

    async def get_events(
        self, ids: Collection[EventId], *, ahead: int = 0
    ) -> Mapping[EventId, AdmittedEvent]:
        found: Mapping[EventId, AdmittedEvent] = await self._storage.get_events(ids, ahead=ahead)
        self.read += len(found)
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self._storage, name)


@pytest.fixture
async def node(engine_spec: EngineSpec) -> AsyncIterator[Node]:
    """A durable node on each engine (PostgreSQL too: the proof rests on every engine
    storing an event only with a state whose history holds it)."""
    node = await Node.open(await engine_spec.fresh(), durable=True, progress=False)
    await node.create_system()
    yield node
    await node.close()


async def _chain(node: Node, edits: int, note: str = "") -> tuple[EntityId, list[EventId]]:
    """An entity edited ``edits`` times after its creation; its event ids, parents first."""
    ctx = node.context()
    async with ctx.transaction() as trx:
        entity = trx.create(Tally, n=0, note=note).id
    for i in range(edits):
        async with ctx.transaction() as trx:
            (await trx.edit(Tally, entity)).n = i + 1
    return entity, [e.id for e in await node.storage.events_of(entity)]


async def _stored(node: Node, entity: EntityId) -> EntityState:
    state = await node.storage.get_state(entity)
    assert state is not None
    return state


async def test_a_peer_far_behind_gets_the_state_and_its_base_without_a_walk(node: Node) -> None:
    entity, events = await _chain(node, 300)
    state, storage = await _stored(node, entity), Counting(node.storage)
    delta = await delta_for(storage, state, (events[1],))
    assert delta is not None
    assert delta.state == state
    assert delta.events == ()
    assert delta.base == (events[1],)
    assert storage.read < 30, f"{storage.read} events read: the history was walked"


async def test_a_peer_an_event_behind_a_large_state_gets_the_event(node: Node) -> None:
    entity, events = await _chain(node, 5, note="x" * 20_000)
    delta = await delta_for(node.storage, await _stored(node, entity), (events[-2],))
    assert delta is not None
    assert delta.state is None
    assert [e.id for e in delta.events] == [events[-1]]


async def test_a_head_not_made_of_this_entitys_stored_events_gets_no_base(node: Node) -> None:
    entity, events = await _chain(node, 3)
    _, others = await _chain(node, 1)
    state = await _stored(node, entity)
    for known in ((EventId(os.urandom(32)),), (others[-1],), (events[1], others[-1])):
        delta = await delta_for(node.storage, state, known)
        assert delta is not None
        assert delta.state == state, known
        assert delta.base is None, known


async def test_a_state_read_before_the_peers_head_was_stored_claims_no_descent(
    node: Node,
) -> None:
    """The race the proof must not fall for: the state was read, then the event the
    peer holds was committed. Taking that state as descending from the peer's head would
    make a trusting peer drop the event it holds."""
    entity, events = await _chain(node, 3)
    stale = await _stored(node, entity)
    for i in range(100):  # (far enough that the walk, short of its budget, cannot tell)
        async with node.context().transaction() as trx:
            (await trx.edit(Tally, entity)).n = 99 + i
    newest = (await node.storage.events_of(entity))[-1].id
    assert newest not in events
    delta = await delta_for(node.storage, stale, (newest,))
    assert delta is not None
    assert delta.state == stale
    assert delta.base is None


__all__ = ["engine_spec", "pg_dsn", "pg_schemas"]  # (the engine fixtures, used here)
