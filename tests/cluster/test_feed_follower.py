"""The feed follower and what a node follows: another node's commits arrive as the change
sets a local commit makes (each entity once, by its last row, in feed order, one batch),
the resident refreshed or read; rows of collections the node does not show are skipped,
their entities evicted and their events not read; a node shows the collections of its
live queries and served subscriptions (all of them while a listener hears of
everything); a store only one node writes is not followed, and a shared store that cannot
be followed is refused (ARCHITECTURE.md §6, §7)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mycelia import EntityId, Node
from mycelia.entity import Entity, EntityChange, Residents
from mycelia.errors import InvalidArgument
from mycelia.node.feed import FeedFollower, follows
from mycelia.node.inprocess import InProcessServer
from mycelia.proto import Clock
from mycelia.storage import MemoryStorage
from mycelia.storage.postgres import PostgresStorage
from tests.cluster.models import Card
from tests.cluster.nodes import create, set_n
from tests.storage.conftest import PostgresSchemas

pytestmark = pytest.mark.postgres


async def test_another_nodes_commits_arrive_as_its_own_change_sets_in_feed_order_in_one_batch(
    pg_schemas: PostgresSchemas,
) -> None:
    schema = pg_schemas.new_schema()
    a = await Node.open(await PostgresStorage(pg_schemas.dsn, schema=schema).open(), durable=True)
    await a.create_system()
    store = await PostgresStorage(pg_schemas.dsn, schema=schema, listen=False).open()
    try:
        x, y = await create(a, "x"), await create(a, "y")
        residents, locks = Residents(), dict[EntityId, asyncio.Lock]()
        heard: list[list[EntityChange]] = []
        follower = FeedFollower(
            store, residents=residents, lock=lambda e: locks.setdefault(e, asyncio.Lock()),
            notify=heard.append,
        )  # fmt: skip
        held = residents.put(Entity.from_state((await store.get_states([x]))[x])).snapshot()
        follower.reported([EntityChange(held, held, (), frozenset())])  # x is shown; y is not
        follower.offset = await store.last_offset()
        local: list[EntityChange] = []
        remove = a.on_change(local.extend)
        for entity, n in ((x, 1), (y, 2), (x, 3)):
            await set_n(a, entity, n)
        remove()
        changes = await follower.step()  # all three rows, read and reported at once
        assert heard == [changes]
        assert [c.after.entity_id for c in changes] == [y, x], "each by its last row, in order"
        got_y, got_x = changes
        made_x = [c for c in local if c.after.entity_id == x]
        made_y = [c for c in local if c.after.entity_id == y]
        assert (got_x.before, got_x.after) == (made_x[0].before, made_x[-1].after)
        assert [e.id for e in got_x.events] == [e.id for c in made_x for e in c.events]
        assert got_x.changed == {"n"}
        resident = residents.get(x)
        assert resident is not None
        assert resident.snapshot() == made_x[-1].after, "the resident was refreshed"
        assert got_y.before.head == Clock(), "y was not shown here: reported from nothing"
        assert got_y.after == made_y[-1].after
        assert residents.get(y) is not None, "what was read became the resident"

        local.clear()
        remove = a.on_change(local.extend)
        await set_n(a, y, 4)  # one event on the head just reported: no walk, no state read
        remove()
        reads: list[str] = []

        def counted(name: str) -> Any:
            read = getattr(store, name)

            def call(*args: Any, **kwargs: Any) -> Any:
                reads.append(name)
                return read(*args, **kwargs)

            return call

        for name in ("get_events", "get_states"):
            setattr(store, name, counted(name))
        (step,) = await follower.step()
        assert reads == ["get_events"], "one read: the row's head event"
        (made,) = local
        assert (step.before, step.after, step.changed) == (made.before, made.after, frozenset("n"))
        assert [e.id for e in step.events] == [e.id for e in made.events], "sent as events"
    finally:
        await store.close()
        await a.close()


async def test_rows_of_collections_the_node_does_not_show_are_skipped_and_their_events_not_read(
    pg_schemas: PostgresSchemas,
) -> None:
    """A server nobody watches a collection through pays nothing per commit there but the
    feed read: the rows are not reported, their entities are evicted (the next reader
    reads the stored state), and their heads' events are not read. Once the collection is
    shown, the next row is reported from the stored state."""
    schema = pg_schemas.new_schema()
    a = await Node.open(await PostgresStorage(pg_schemas.dsn, schema=schema).open(), durable=True)
    await a.create_system()
    store = await PostgresStorage(pg_schemas.dsn, schema=schema, listen=False).open()
    try:
        x = await create(a, "x")
        residents, locks = Residents(), dict[EntityId, asyncio.Lock]()
        heard: list[list[EntityChange]] = []
        shown: set[str] = set()
        follower = FeedFollower(
            store, residents=residents, lock=lambda e: locks.setdefault(e, asyncio.Lock()),
            notify=heard.append, shows=lambda: shown,
        )  # fmt: skip
        held = residents.put(Entity.from_state((await store.get_states([x]))[x])).snapshot()
        follower.reported([EntityChange(held, held, (), frozenset())])
        follower.offset = await store.last_offset()
        await set_n(a, x, 1)
        fetched: list[tuple[str, Any]] = []
        fetch = store._fetch

        async def counted(name: str, params: Any) -> Any:
            rows = await fetch(name, params)
            fetched.append((name, rows))
            return rows

        store._fetch = counted  # type: ignore[method-assign]
        assert await follower.step() == []
        assert heard == [], "nothing reported"
        assert residents.get(x) is None, "the resident was evicted: it is behind the store"
        ((name, rows),) = fetched
        assert name == "feed_heads"
        assert [row[4] for row in rows] == [None], "the row came without its head's events"

        shown.add("cards")
        await set_n(a, x, 2)
        (change,) = await follower.step()
        assert heard == [[change]]
        assert change.before.head == Clock(), "reported from nothing: this node showed none"
        assert change.after.values["n"] == 2
        assert residents.get(x) is not None
    finally:
        await store.close()
        await a.close()


async def test_a_node_shows_the_collections_of_its_live_queries_and_subscriptions(
    pair: tuple[Node, Node],
) -> None:
    """What the follower reads: every collection while a listener hears of everything
    (``on_change``'s default), else those live queries and served subscriptions read."""
    _, b = pair
    assert b._shows() == set()
    remove = b.on_change(lambda _: None)
    assert b._shows() is None
    remove()
    remove = b.on_change(lambda _: None, everything=False)
    assert b._shows() == set()
    remove()
    async with b.context().query(Card, "n >= 0"):
        assert b._shows() == {"cards"}
    assert b._shows() == set()
    client = await Node.open(MemoryStorage(), durable=False)
    try:
        async with InProcessServer(b) as server:
            server.connect(client)
            await client.wait_ready(timeout=10)
            async with client.context().query(Card, "n >= 0"):
                assert b._shows() == {"cards"}, "the subscription mirroring it reads cards"
    finally:
        await client.close()


async def test_a_node_on_a_store_only_it_writes_follows_no_feed() -> None:
    assert not follows(MemoryStorage())
    assert follows(PostgresStorage("postgresql://unused"))


async def test_a_shared_store_that_cannot_be_followed_is_refused() -> None:
    """A node on it would silently never hear of the other processes' commits."""

    class Shared(MemoryStorage):
        shared = True

    with pytest.raises(InvalidArgument, match="read_feed"):
        follows(Shared())
    with pytest.raises(InvalidArgument, match="read_feed"):
        await Node.open(Shared(), durable=True)
