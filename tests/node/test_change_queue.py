"""A live query's change sets wait in a queue bounded by the result, not by the commits: a
set the reader has not taken absorbs the next, and what the reader takes still adds up to
the result (mycelia.node.changes)."""

from __future__ import annotations

import random

from mycelia import EntityId, Model, Node
from mycelia.node.changes import ChangeQueue, ChangeSet
from mycelia.storage import MemoryStorage


class Card(Model, collection="cards"):
    rank: int


async def _node() -> Node:
    node = await Node.open(MemoryStorage(), durable=True)
    await node.create_system()
    return node


def _replay(result: dict[EntityId, int], changes: ChangeSet[Card]) -> None:
    for view in (*changes.initial, *changes.added, *changes.updated):
        result[view.id] = view.rank
    for view in changes.removed:
        del result[view.id]


async def test_a_query_nobody_iterates_holds_one_view_per_entity_not_one_set_per_commit() -> None:
    node = await _node()
    async with node.context().transaction() as trx:
        ids = [trx.create(Card, rank=0).id for _ in range(10)]
    async with node.context().query(Card, "rank >= 0") as live:
        for n in range(1, 101):
            async with node.context().transaction() as trx:
                (await trx.edit(Card, ids[n % 10])).rank = n
        first, merged = live.changes_nowait()
    assert len(first.initial) == 10
    assert not merged.added
    assert not merged.removed
    assert sorted(v.rank for v in merged.updated) == list(range(91, 101))


async def test_a_reader_that_keeps_up_sees_every_set_as_emitted() -> None:
    node = await _node()
    async with node.context().transaction() as trx:
        card = trx.create(Card, rank=0).id
    async with node.context().query(Card, "rank >= 0") as live:
        changes = aiter(live)
        assert [v.rank for v in (await anext(changes)).initial] == [0]
        for rank in (1, 2, 3):
            async with node.context().transaction() as trx:
                (await trx.edit(Card, card)).rank = rank
            assert [v.rank for v in (await anext(changes)).updated] == [rank]


async def test_unread_enter_then_leave_says_nothing_and_leave_then_enter_is_an_update() -> None:
    node = await _node()
    async with node.context().transaction() as trx:
        kept = trx.create(Card, rank=1).id
    async with node.context().query(Card, "rank > 0") as live:
        live.changes_nowait()  # the initial set
        async with node.context().transaction() as trx:
            passing = trx.create(Card, rank=5).id
        async with node.context().transaction() as trx:
            (await trx.edit(Card, passing)).rank = 0  # left before anyone read it
        for rank in (0, 7):
            async with node.context().transaction() as trx:
                (await trx.edit(Card, kept)).rank = rank  # left, then came back
        (merged,) = live.changes_nowait()
    assert not merged.added
    assert not merged.removed
    assert [(v.id, v.rank) for v in merged.updated] == [(kept, 7)]


async def test_sets_taken_at_random_moments_add_up_to_the_result() -> None:
    rng = random.Random(7)
    node = await _node()
    async with node.context().query(Card, "rank > 10 ORDER BY rank") as live:
        shown: dict[EntityId, int] = {}
        ids: list[EntityId] = []
        for _ in range(300):
            async with node.context().transaction() as trx:
                if not ids or rng.random() < 0.2:
                    ids.append(trx.create(Card, rank=rng.randrange(20)).id)
                else:
                    (await trx.edit(Card, rng.choice(ids))).rank = rng.randrange(20)
            if rng.random() < 0.3:
                for changes in live.changes_nowait():
                    _replay(shown, changes)
        for changes in live.changes_nowait():
            _replay(shown, changes)
        assert shown == {v.id: v.rank for v in live.items}


async def test_the_end_marker_follows_what_was_queued_and_stays_for_the_iterator() -> None:
    queue: ChangeQueue[Card] = ChangeQueue()
    node = await _node()
    async with node.context().transaction() as trx:
        view = trx.create(Card, rank=3)
    queue.start([])
    queue.put(ChangeSet(added=[view]))
    queue.end()
    first, added = queue.take_all()
    assert first.initial == []
    assert added.added == [view]
    assert queue.take_all() == []
    assert await queue.get() is None


async def test_a_set_nothing_waits_for_is_taken_as_emitted_and_an_empty_one_is_no_set() -> None:
    queue: ChangeQueue[Card] = ChangeQueue()
    node = await _node()
    async with node.context().transaction() as trx:
        one, two = trx.create(Card, rank=1), trx.create(Card, rank=2)
    queue.start([])
    await queue.get()
    emitted = ChangeSet(added=[one])
    queue.put(ChangeSet())
    queue.put(emitted)
    (taken,) = queue.take_all()
    assert taken is emitted
    assert queue.take_all() == []
    queue.put(ChangeSet(added=[one]))
    queue.put(ChangeSet(removed=[one], added=[two]))  # absorbs into the first, not taken
    (merged,) = queue.take_all()
    assert merged.added == [two]
    assert not merged.removed
    assert not merged.updated
