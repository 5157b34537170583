"""Live queries checked by the kit: items, change stream and a fresh fetch must agree.

The simulator keeps live queries open on every node (``SimConfig(watch=True)``, the
default). It found that a notification carrying two changes of one entity (a genesis, then
an update held for it and released by the same ingest) left live queries with a stale view;
commit 8542f6b fixed it. These tests keep it fixed.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from mycelia import Model, Node
from mycelia.retrieval import WriteBatch
from mycelia.storage import MemoryStorage
from mycelia.testing import LiveQueryMismatch, SimConfig, WatchedQuery, run_seed


class Note(Model, collection="notes"):
    title: str


async def _two_nodes() -> tuple[Node, Node]:
    a = await Node.open(MemoryStorage(), durable=True)
    await a.create_system()
    b = await Node.open(MemoryStorage(), durable=True)
    await b.join_system(await a.system_events())
    return a, b


async def test_a_watched_query_agrees_with_a_fetch_after_ordinary_ingests() -> None:
    a, b = await _two_nodes()
    watched = await WatchedQuery.open(b.context(), Note, "")
    async with a.context().transaction() as trx:
        note = trx.create(Note, title="first")
    await b.ingest(await a.storage.events_of(note.id))
    async with a.context().transaction() as trx:
        (await trx.edit(Note, note.id)).title = "second"
    await b.ingest(await a.storage.events_of(note.id))
    await watched.check("b")
    assert [n.title for n in watched.live.items] == ["second"]


async def test_a_watched_query_reports_a_view_that_storage_contradicts() -> None:
    _, b = await _two_nodes()
    watched = await WatchedQuery.open(b.context(), Note, "")
    async with b.context().transaction() as trx:
        trx.create(Note, title="here")
    # Storage changes behind the node's back (a fault injected at the edge): the live
    # query never hears of it, and the checker must say so.
    stored = await b.storage.scan("notes")
    changed = replace(stored[0], values={**stored[0].values, "title": "elsewhere"})
    await b.storage.write(WriteBatch(states=(changed,)))
    with pytest.raises(LiveQueryMismatch, match="fetch"):
        await watched.check("b")


async def test_a_live_query_sees_an_update_released_with_its_genesis() -> None:
    a, b = await _two_nodes()
    async with a.context().transaction() as trx:
        note = trx.create(Note, title="first")
    async with a.context().transaction() as trx:
        (await trx.edit(Note, note.id)).title = "second"
    genesis, update = await a.storage.events_of(note.id)
    watched = await WatchedQuery.open(b.context(), Note, "")
    await b.ingest([update])  # held: its parent is unknown here
    await b.ingest([genesis])  # admits the genesis, then releases the update: one notify
    await watched.check("b")
    assert [n.title for n in watched.live.items] == ["second"]


def test_the_seed_that_found_the_stale_view_converges_with_live_queries_watched() -> None:
    run_seed(9, SimConfig(watch=True), shrink_runs=0)


def test_watched_queries_close_cleanly() -> None:
    async def go() -> None:
        _, b = await _two_nodes()
        query = "title IS NOT NULL ORDER BY title LIMIT 2"
        watched = await WatchedQuery.open(b.context(), Note, query)
        await watched.check("b")
        await watched.live.close()

    asyncio.run(go())
