"""Live queries: after every step the live result equals a fresh fetch, and the change
sets received add up to exactly that result — locally and through a server."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mycelia
from mycelia import EntityId, Model, Node
from mycelia.errors import StorageError
from mycelia.node.inprocess import InProcessServer
from mycelia.node.live import ChangeSet, LiveQuery
from mycelia.node.reactor import _Ranges
from mycelia.proto.query import Query
from mycelia.retrieval import StoredState
from mycelia.storage import MemoryStorage
from mycelia.storage.plan import KeyRange
from tests.node.waiting import until


class Item(Model, collection="items"):
    n: int | None
    tag: str | None


QUERIES = [
    ("", ()),
    ("n > ?", (0,)),
    ("n > 0 ORDER BY n DESC", ()),
    ("tag IN ('a', 'b') OR n IS NULL", ()),
    ("NOT (n < 0) ORDER BY tag, n LIMIT 3", ()),
    ("n >= -1 ORDER BY n LIMIT 2", ()),
    ("tag = 'a' AND n > ?", (-5,)),  # pinned: indexed under tag = 'a'
    ("tag = 'b' ORDER BY n DESC LIMIT 2", ()),
    ("n > ? AND n <= 2", (-2,)),  # ranged: indexed under the key range of n
    ("n IN (0, 2) ORDER BY n", ()),
    ("n < 2 AND tag > 'a' ORDER BY tag LIMIT 2", ()),
    ("n >= 1 AND n < 1", ()),  # no key can match
    ("tag >= 'b'", ()),
]

values = st.fixed_dictionaries(
    {"n": st.none() | st.integers(-3, 3), "tag": st.none() | st.sampled_from(["a", "b", "c"])}
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("create"), values),
        st.tuples(st.just("edit"), st.tuples(st.integers(0, 20), values)),
        st.tuples(st.just("delete"), st.integers(0, 20)),
    ),
    min_size=1,
    max_size=12,
)


def replay(model: dict[EntityId, Item], changes: list[ChangeSet[Item]]) -> None:
    for change in changes:
        for view in change.initial + change.added + change.updated:
            model[view.id] = view
        for view in change.removed:
            assert view.id in model, "a removal of something never added"
            del model[view.id]


async def step(writer: Node, ids: list[EntityId], op: tuple[str, object]) -> None:
    kind, arg = op
    async with writer.context().transaction() as trx:
        if kind == "create":
            assert isinstance(arg, dict)
            ids.append(trx.create(Item, **arg).id)
            return
        if not ids:
            return
        if kind == "edit":
            assert isinstance(arg, tuple)
            index, fields = arg
        else:
            index, fields = arg, {}
        target = ids[int(index) % len(ids)]
        if target not in [v.id for v in await writer.context().fetch(Item, "")]:
            return  # deleted already
        if kind == "edit":
            handle = await trx.edit(Item, target)
            handle.n, handle.tag = fields["n"], fields["tag"]
        else:
            await trx.delete(Item, target)


async def check(
    live: LiveQuery[Item],
    model: dict[EntityId, Item],
    source: Node,
    text: str,
    args: tuple[object, ...],
    watcher: Node,
) -> None:
    def rows(views: list[Item]) -> list[tuple[EntityId, int | None, str | None]]:
        return [(v.id, v.n, v.tag) for v in views]

    async def agrees() -> bool:
        await live.wait_settled()
        return rows(live.items) == rows(await source.context().fetch(Item, text, *args))

    await until(watcher, agrees)
    fresh = await source.context().fetch(Item, text, *args)
    replay(model, live.changes_nowait())
    assert set(model) == {v.id for v in fresh}
    assert all(model[v.id] == v for v in live.items)


@settings(max_examples=max(25, settings().max_examples // 3), deadline=None)
@given(query=st.sampled_from(QUERIES), ops=operations)
def test_local_live_queries_follow_every_commit(
    query: tuple[str, tuple[object, ...]], ops: list[tuple[str, object]]
) -> None:
    async def run() -> None:
        node = await Node.open(MemoryStorage(), durable=True)
        await node.create_system()
        ids: list[EntityId] = []
        model: dict[EntityId, Item] = {}
        async with node.context().query(Item, query[0], *query[1]) as live:
            for op in ops:
                await step(node, ids, op)
                await check(live, model, node, query[0], query[1], node)

    asyncio.run(run())


@settings(max_examples=max(15, settings().max_examples // 6), deadline=None)
@given(ops=operations)
def test_every_live_query_open_at_once_follows_every_commit(
    ops: list[tuple[str, object]],
) -> None:
    """All the shapes at once: the candidate index routes each change among them."""

    async def run() -> None:
        node = await Node.open(MemoryStorage(), durable=True)
        await node.create_system()
        ids: list[EntityId] = []
        models: list[dict[EntityId, Item]] = [{} for _ in QUERIES]
        lives = [node.context().query(Item, text, *args) for text, args in QUERIES]
        for live in lives:
            await live.__aenter__()
        for op in ops:
            await step(node, ids, op)
            for live, model, (text, args) in zip(lives, models, QUERIES, strict=True):
                await check(live, model, node, text, args, node)
        for live in lives:
            await live.close()

    asyncio.run(run())


@given(
    ranges=st.lists(
        st.tuples(st.binary(max_size=2), st.binary(max_size=2)), min_size=0, max_size=40
    ),
    key=st.binary(min_size=1, max_size=2),
)
def test_the_range_index_finds_exactly_the_ranges_holding_a_key(
    ranges: list[tuple[bytes, bytes]], key: bytes
) -> None:
    index = _Ranges()
    lives = [object() for _ in ranges]
    for live, (low, high) in zip(lives, ranges, strict=True):
        index.add(live, (KeyRange(low, high),))  # type: ignore[arg-type]  # any hashable
    dropped = lives[::3]
    for live in dropped:
        index.remove(live)  # type: ignore[arg-type]
    expected = [
        live
        for live, (low, high) in zip(lives, ranges, strict=True)
        if live not in dropped and low <= key < high
    ]
    assert index.holding(key) == expected, "every holder, in registration order"


@pytest.fixture
async def remote() -> AsyncIterator[tuple[Node, Node]]:
    server_node = await Node.open(MemoryStorage(), durable=True)
    await server_node.create_system()
    server = await mycelia.serve(server_node, host="127.0.0.1", port=0)
    client = await Node.open(MemoryStorage(), durable=False)
    await mycelia.connect(client, f"ws://127.0.0.1:{server.port}")
    await client.wait_ready(timeout=10)
    yield server_node, client
    await client.close()
    await server.close()
    await server_node.close()


@pytest.mark.parametrize("query", QUERIES, ids=[q[0] or "everything" for q in QUERIES])
async def test_remote_live_queries_follow_commits_made_on_the_server(
    remote: tuple[Node, Node], query: tuple[str, tuple[object, ...]]
) -> None:
    server_node, client = remote
    ids: list[EntityId] = []
    model: dict[EntityId, Item] = {}
    script = [
        ("create", {"n": 1, "tag": "a"}),
        ("create", {"n": -1, "tag": None}),
        ("create", {"n": None, "tag": "c"}),
        ("edit", (0, {"n": -2, "tag": "b"})),
        ("create", {"n": 3, "tag": "b"}),
        ("delete", 2),
        ("edit", (1, {"n": 2, "tag": "a"})),
        ("create", {"n": 0, "tag": "a"}),
        ("delete", 0),
    ]
    async with client.context().query(Item, query[0], *query[1]) as live:
        for op in script:
            await step(server_node, ids, op)
            await check(live, model, server_node, query[0], query[1], client)


async def test_a_no_op_delta_emits_nothing() -> None:
    node = await Node.open(MemoryStorage(), durable=True)
    await node.create_system()
    async with node.context().transaction() as trx:
        item = trx.create(Item, n=1, tag="a")
    async with node.context().query(Item, "n > 0") as live:
        assert live.changes_nowait()[0].initial
        history = await node.context().history(Item, item.id)
        await node.ingest(history)  # re-delivery: nothing changes
        assert live.changes_nowait() == []


async def test_changing_the_query_in_place_moves_the_result() -> None:
    node = await Node.open(MemoryStorage(), durable=True)
    await node.create_system()
    async with node.context().transaction() as trx:
        low, high = trx.create(Item, n=1, tag=None), trx.create(Item, n=9, tag=None)
    async with node.context().query(Item, "n < 5") as live:
        live.changes_nowait()
        await live.update_query("n > ?", 5)
        (change,) = live.changes_nowait()
        assert [v.id for v in change.added] == [high.id]
        assert [v.id for v in change.removed] == [low.id]


async def test_a_limit_query_refills_when_a_member_leaves_and_emits_the_removal() -> None:
    node = await Node.open(MemoryStorage(), durable=True)
    await node.create_system()
    async with node.context().transaction() as trx:
        items = [trx.create(Item, n=i, tag=None) for i in range(4)]
    async with node.context().query(Item, "n >= 0 ORDER BY n LIMIT 2") as live:
        assert [v.n for v in live.items] == [0, 1]
        live.changes_nowait()
        async with node.context().transaction() as trx:
            await trx.delete(Item, items[0].id)
        await live.wait_settled()
        (change,) = live.changes_nowait()
        assert [v.id for v in change.removed] == [items[0].id]
        assert [v.id for v in change.added] == [items[2].id]
        assert [v.n for v in live.items] == [1, 2]


@pytest.mark.parametrize("text", ["n < 5", "n < 5 ORDER BY n LIMIT 3"])
async def test_a_commit_while_the_result_is_read_again_is_applied_after_it(text: str) -> None:
    """A change committed while a refresh reads storage is applied to the result it reads.
    Before, the refresh's older read replaced the change's effect: the query showed a row
    that had left, at its old value, for good (a reconnect's answer refreshes every mirrored
    query, so a restart under load met this)."""
    node = await Node.open(MemoryStorage(), durable=True)
    await node.create_system()
    async with node.context().transaction() as trx:
        leaving, staying = trx.create(Item, n=1, tag=None), trx.create(Item, n=2, tag=None)
    async with node.context().query(Item, text) as live:
        read, go_on = asyncio.Event(), asyncio.Event()
        rows = live._parts.rows

        async def paused(collection: str, query: Query) -> list[StoredState]:
            found = await rows(collection, query)
            read.set()
            await go_on.wait()
            return found

        live._parts = replace(live._parts, rows=paused)
        refreshing = asyncio.create_task(live.refresh())
        await asyncio.wait_for(read.wait(), 10)
        async with node.context().transaction() as trx:
            (await trx.edit(Item, leaving.id)).n = 9  # leaves the result
            (await trx.edit(Item, staying.id)).n = 3
        go_on.set()
        await asyncio.wait_for(refreshing, 10)
        await live.wait_settled()
        assert [(v.id, v.n) for v in live.items] == [(staying.id, 3)]
        shown: dict[EntityId, Item] = {}
        replay(shown, live.changes_nowait())
        assert shown == {v.id: v for v in live.items}


async def test_a_refresh_that_fails_still_applies_what_came_while_it_read() -> None:
    """A refresh whose read fails leaves the result it showed, with the changes committed
    meanwhile applied (they were held for after the read)."""
    node = await Node.open(MemoryStorage(), durable=True)
    await node.create_system()
    async with node.context().transaction() as trx:
        leaving = trx.create(Item, n=1, tag=None)
    async with node.context().query(Item, "n < 5") as live:
        read, go_on = asyncio.Event(), asyncio.Event()

        async def failing(collection: str, query: Query) -> list[StoredState]:
            read.set()
            await go_on.wait()
            raise StorageError("the disk went away")

        live._parts = replace(live._parts, rows=failing)
        refreshing = asyncio.create_task(live.refresh())
        await asyncio.wait_for(read.wait(), 10)
        async with node.context().transaction() as trx:
            (await trx.edit(Item, leaving.id)).n = 9  # leaves the result
        go_on.set()
        with pytest.raises(StorageError):
            await asyncio.wait_for(refreshing, 10)
        assert live.items == []
        shown: dict[EntityId, Item] = {}
        replay(shown, live.changes_nowait())
        assert shown == {}


LIMITED = [q for q in QUERIES if "LIMIT" in q[0]] + [("n >= 0 LIMIT 3", ())]
"""LIMIT queries (one without ORDER BY: ranked by entity id alone)."""


@settings(max_examples=max(60, settings().max_examples), deadline=None)
@given(
    query=st.sampled_from(LIMITED),
    seed=st.lists(values, min_size=0, max_size=8),
    transactions=st.lists(
        st.lists(st.tuples(st.integers(0, 20), values | st.none()), min_size=1, max_size=4),
        min_size=1,
        max_size=8,
    ),
    ids_seed=st.integers(0, 2**32),
    served=st.booleans(),
)
def test_a_limit_query_placed_without_storage_is_what_a_fresh_fetch_gives(
    query: tuple[str, tuple[object, ...]],
    seed: list[dict[str, Any]],
    transactions: list[list[tuple[int, dict[str, Any] | None]]],
    ids_seed: int,
    served: bool,
) -> None:
    """A LIMIT query places most changes from its own ranks (no query): after every
    commit of several edits and deletes, its result is a fresh fetch's, and its change
    sets add up to it — on the node that commits, and (``served``) on a client of it,
    whose subscription the node places the same way."""

    async def run() -> None:
        node = await Node.open(MemoryStorage(), durable=True, rng=random.Random(ids_seed))
        await node.create_system()
        async with node.context().transaction() as trx:
            ids = [trx.create(Item, **fields).id for fields in seed]
        async with AsyncExitStack() as stack:
            watcher = await stack.enter_async_context(_client_of(node)) if served else node
            await _edit_and_check(node, watcher, ids, query, transactions)

    asyncio.run(run())


@asynccontextmanager
async def _client_of(node: Node) -> AsyncIterator[Node]:
    """An ephemeral client of ``node``, connected in process."""
    server = InProcessServer(node)
    client = await Node.open(MemoryStorage(), durable=False)
    server.connect(client)
    await client.wait_ready(timeout=10)
    try:
        yield client
    finally:
        await client.close()
        await server.close()


async def _edit_and_check(
    node: Node,
    watcher: Node,
    ids: list[EntityId],
    query: tuple[str, tuple[object, ...]],
    transactions: list[list[tuple[int, dict[str, Any] | None]]],
) -> None:
    """Commit each of ``transactions`` on ``node`` (creates, edits and deletes by index
    into ``ids``), checking ``watcher``'s live query against a fresh fetch after each."""
    model: dict[EntityId, Item] = {}
    async with watcher.context().query(Item, query[0], *query[1]) as live:
        for edits in transactions:
            alive = {v.id for v in await node.context().fetch(Item, "")}
            async with node.context().transaction() as trx:
                for index, fields in edits:
                    target = ids[index % len(ids)] if ids else None
                    if fields is not None and (target is None or index % 3 == 0):
                        ids.append(trx.create(Item, **fields).id)
                    elif target in alive and fields is not None:
                        handle = await trx.edit(Item, target)
                        handle.n, handle.tag = fields["n"], fields["tag"]
                    elif target in alive:
                        await trx.delete(Item, target)
                        alive.discard(target)
            await check(live, model, node, query[0], query[1], watcher)


def count_fetches(node: Node) -> list[int]:
    """Count the queries ``node`` runs against its storage from now on (one-item list)."""
    queried = [0]
    storage = node.storage
    assert isinstance(storage, MemoryStorage)
    fetch = storage.fetch  # how a query reads the store

    async def counted(collection: str, query: Any, *, after: Any = None) -> Any:
        queried[0] += 1
        return await fetch(collection, query, after=after)

    storage.fetch = counted  # type: ignore[method-assign]
    return queried


async def test_a_limit_query_places_a_change_to_a_member_without_a_query() -> None:
    """The common change — a member edited in place, a match ranked past the LIMIT —
    costs no storage query (before: every change re-ran the query, O(matches))."""
    node = await Node.open(MemoryStorage(), durable=True)
    await node.create_system()
    async with node.context().transaction() as trx:
        items = [trx.create(Item, n=i + 10, tag="a") for i in range(50)]
    async with node.context().query(Item, "n >= 0 ORDER BY n LIMIT 5") as live:
        live.changes_nowait()
        queried = count_fetches(node)
        async with node.context().transaction() as trx:
            (await trx.edit(Item, items[2].id)).tag = "b"  # a member, in place
            (await trx.edit(Item, items[30].id)).n = 100  # past the LIMIT: nothing
        (first,) = live.changes_nowait()
        async with node.context().transaction() as trx:
            (await trx.edit(Item, items[40].id)).n = 0  # ranks first: 4 leaves
        (second,) = live.changes_nowait()
        await live.wait_settled()
        assert queried == [0]
        assert [v.tag for v in first.updated] == ["b"]
        assert not first.added
        assert [v.id for v in second.added] == [items[40].id]
        assert [v.id for v in second.removed] == [items[4].id]
        assert [v.n for v in live.items] == [0, 10, 11, 12, 13]
        async with node.context().transaction() as trx:
            await trx.delete(Item, items[0].id)  # makes room: storage ranks the refill
        await live.wait_settled()
        assert queried == [1]
        assert [v.n for v in live.items] == [0, 11, 12, 13, 14]


async def test_a_served_limit_subscription_places_a_change_to_a_member_without_a_query(
    remote: tuple[Node, Node],
) -> None:
    """The server ranks a client's LIMIT subscription the same way: an in-place edit of a
    member, or a match ranked past the LIMIT, costs the server no storage query."""
    server_node, client = remote
    async with server_node.context().transaction() as trx:
        items = [trx.create(Item, n=i + 10, tag="a") for i in range(50)]
    async with client.context().query(Item, "n >= 0 ORDER BY n LIMIT 5") as live:
        changes = aiter(live)
        await asyncio.wait_for(anext(changes), 10)
        queried = count_fetches(server_node)
        async with server_node.context().transaction() as trx:
            (await trx.edit(Item, items[2].id)).tag = "b"  # a member, in place
            (await trx.edit(Item, items[30].id)).n = 100  # past the LIMIT: nothing
        first = await asyncio.wait_for(anext(changes), 10)
        async with server_node.context().transaction() as trx:
            (await trx.edit(Item, items[40].id)).n = 0  # ranks first: 4 leaves
        second = await asyncio.wait_for(anext(changes), 10)
        assert [v.tag for v in first.updated] == ["b"]
        assert [v.id for v in second.added] == [items[40].id]
        assert [v.id for v in second.removed] == [items[4].id]
        assert queried == [0]
        async with server_node.context().transaction() as trx:
            await trx.delete(Item, items[0].id)  # makes room: the server ranks the refill
        await until(client, lambda: _is(live, [0, 11, 12, 13, 14]))
        assert queried[0] >= 1


async def _is(live: LiveQuery[Item], ns: list[int]) -> bool:
    return [v.n for v in live.items] == ns
