"""MemoryStorage keeps events and feed rows as bytes (:mod:`mycelia.storage.memory`): what
the recent window no longer holds decoded reads back equal, and the collector's heap does
not grow by objects per stored event."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Collection

import pytest

from mycelia.proto import AdmittedEvent, Clock, EntityId
from mycelia.retrieval import WriteBatch
from mycelia.storage import MemoryStorage
from mycelia.storage.memory import MEMORY_RECENT_EVENTS
from mycelia.storage.recent import RECENT_EVENTS, RecentEvents
from mycelia.storage.testing import genesis, state_of, update


def chain_of(length: int, n: int = 1) -> list[AdmittedEvent]:
    chain = [genesis(n=n)]
    for i in range(length - 1):
        chain.append(update([chain[-1]], b"%d" % i))
    return chain


def as_read(events: list[AdmittedEvent]) -> list[tuple[bytes, int]]:
    return [(e.event.to_bytes(), e.generation) for e in events]


async def test_events_past_the_recent_window_read_back_as_written() -> None:
    chain = chain_of(max(RECENT_EVENTS, MEMORY_RECENT_EVENTS) + 50)
    store = MemoryStorage()
    for start in range(0, len(chain), 500):
        await store.write(WriteBatch(tuple(chain[start : start + 500])))
    oldest = chain[:5]
    found = await store.get_events([e.id for e in oldest])
    assert as_read([found[e.id] for e in oldest]) == as_read(oldest)
    assert as_read(await store.events_of(chain[0].entity_id)) == as_read(chain)
    ahead = await store.get_events([chain[3].id], ahead=2)
    assert set(ahead) == {chain[3].id, chain[2].id, chain[1].id}
    await store.write(WriteBatch(forget=(chain[0].entity_id,)))
    assert await store.get_events([chain[0].id, chain[-1].id]) == {}


async def test_feed_rows_read_back_as_written() -> None:
    store = MemoryStorage()
    first, second = chain_of(2, n=1), chain_of(1, n=2)
    for events in (first[:1], first, second):
        await store.write(WriteBatch(tuple(events), (state_of([events[-1]]),)))
    rows = await store.read_since(1)
    assert [(r.offset, r.entity_id, r.collection, r.head) for r in rows] == [
        (2, first[0].entity_id, "items", Clock.single(first[1].id)),
        (3, second[0].entity_id, "items", Clock.single(second[0].id)),
    ]


async def test_a_wide_head_s_feed_row_is_the_state_s_own_clock() -> None:
    # Copying a head of 1,000 tips into the row cost O(width) a write (32 KB a row).
    store = MemoryStorage()
    root = genesis(n=1)
    tips = [update([root], b"%d" % i) for i in range(3)]
    wide = state_of(tips)
    await store.write(WriteBatch((root, *tips), (wide,)))
    (row,) = await store.read_since(0)
    assert row.head == Clock(t.id for t in tips)
    assert row.head is wide.state.state.head


async def test_stored_events_are_not_objects_the_collector_walks() -> None:
    # As objects, each stored event was about eight tracked ones (the event, its
    # admission, its id, its parent clock and that clock's tuple, its feed row...), and an
    # editor's client walked them all in every full collection.
    count = 10 * RECENT_EVENTS
    store = MemoryStorage()
    gc.collect()
    before = len(gc.get_objects())
    chain = chain_of(count)
    for start in range(0, count, 1000):
        await store.write(WriteBatch(tuple(chain[start : start + 1000])))
    del chain
    gc.collect()
    grown = len(gc.get_objects()) - before
    assert grown < count, f"{grown} tracked objects for {count} stored events"


async def test_feed_rows_are_not_objects_the_collector_walks() -> None:
    # A row held the state's EntityId, whose type is a Python class the collector tracks,
    # so the row stayed tracked too: one more object in every full collection for each
    # write ever made (a W3 client rewrites its states two thousand times).
    count = 1000
    chain = chain_of(count)
    states = [state_of([e]) for e in chain]
    store = MemoryStorage()
    await store.write(WriteBatch(tuple(chain), (states[0],)))
    gc.collect()
    before = len(gc.get_objects())
    tracemalloc.start()
    try:
        for state in states[1:]:
            await store.write(WriteBatch(states=(state,)))
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    gc.collect()
    grown = len(gc.get_objects()) - before
    assert grown < count // 10, f"{grown} tracked objects after {count} writes of one state"
    # A row is a 3-tuple (64 bytes), its head's id (65) and its list slot; the entity id's
    # bytes are one copy for all its rows (a copy each was 65 bytes more a row).
    assert held < count * 160, f"{held:,} bytes for {count} feed rows"
    rows = await store.read_since(count - 2)
    assert [r.entity_id for r in rows] == [chain[0].entity_id] * 2
    assert type(rows[0].entity_id) is EntityId


async def test_a_write_forgetting_many_entities_passes_over_the_recent_events_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each pass walks every recent event (4,096): a reset of a thousand entities made a
    # thousand passes.
    store = MemoryStorage()
    chains = [chain_of(3, n=n) for n in range(1, 51)]
    await store.write(WriteBatch(tuple(e for chain in chains for e in chain)))
    passes = []
    forget = RecentEvents.forget_entities

    def counted(self: RecentEvents, entities: Collection[EntityId]) -> None:
        passes.append(len(entities))
        forget(self, entities)

    monkeypatch.setattr(RecentEvents, "forget_entities", counted)
    await store.write(WriteBatch(forget=tuple(chain[0].entity_id for chain in chains[:40])))
    assert passes == [40]
    kept = await store.get_events([chain[-1].id for chain in chains])
    assert set(kept) == {chain[-1].id for chain in chains[40:]}


async def test_a_stored_event_s_bytes_are_held_once() -> None:
    # The store kept "generation + canonical bytes", a copy of every event's bytes beside
    # the decoded events' own (a W3 client: 0.8 of its 4.0 MB), and 4,096 events decoded.
    count, payload = 2000, 2000
    chain = [genesis(n=1)]
    for i in range(count - 1):
        chain.append(update([chain[-1]], b"%05d" % i + b"x" * payload))
    held = sum(len(e.event.to_bytes()) for e in chain)
    store = MemoryStorage()
    gc.collect()
    tracemalloc.start()
    try:
        for start in range(0, count, 500):
            await store.write(WriteBatch(tuple(chain[start : start + 500])))
        grown = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert grown < held / 4, f"storing {held:,} bytes of events took {grown:,} more"
    found = await store.get_events([chain[5].id])
    assert found[chain[5].id].event.to_bytes() == chain[5].event.to_bytes()
