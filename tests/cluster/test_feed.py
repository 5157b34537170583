"""Nodes on one PostgreSQL follow its change feed: what another node commits reaches this
node's residents, live queries and the subscriptions it serves, as the change sets a local
commit makes, in feed order, a batch at a time (ARCHITECTURE.md §6, §7)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from mycelia import EntityId, Model, Node
from mycelia.entity import Entity, EntityChange, Residents
from mycelia.entity.verdicts import head_after
from mycelia.errors import EntityNotFound, InvalidArgument
from mycelia.node.feed import FeedFollower, follows
from mycelia.node.inprocess import InProcessServer
from mycelia.proto import AdmittedEvent, Clock
from mycelia.storage import MemoryStorage, postgres_write
from mycelia.storage.postgres import PostgresStorage
from mycelia.storage.postgres_notice import notice
from tests.cluster.models import Card
from tests.node.waiting import until
from tests.storage.conftest import PostgresSchemas

pytestmark = pytest.mark.postgres


class Flag(Model, collection="flags"):
    """A collection apart from the cards."""

    up: bool = True


async def open_pair(
    schemas: PostgresSchemas, **options: float
) -> tuple[Node, Node, PostgresStorage, PostgresStorage]:
    """Two durable nodes on one schema (one system), each with its own engine."""
    schema = schemas.new_schema()
    first = await PostgresStorage(schemas.dsn, schema=schema, **options).open()  # type: ignore[arg-type]
    a = await Node.open(first, durable=True)
    await a.create_system()
    second = await PostgresStorage(schemas.dsn, schema=schema, **options).open()  # type: ignore[arg-type]
    b = await Node.open(second, durable=True)
    assert b.system_root == a.system_root
    return a, b, first, second


@pytest.fixture
async def pair(pg_schemas: PostgresSchemas) -> AsyncIterator[tuple[Node, Node]]:
    a, b, _, _ = await open_pair(pg_schemas)
    yield a, b
    await a.close()
    await b.close()


async def create(node: Node, title: str) -> EntityId:
    async with node.context().transaction() as trx:
        return trx.create(Card, title=title, body="").id


def queries_of(engine: PostgresStorage, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the statements ``engine`` runs from now on (for this test)."""
    fetched: list[str] = []
    fetch = engine._fetch

    async def counted(name: str, *args: Any, **kwargs: Any) -> Any:
        fetched.append(name)
        return await fetch(name, *args, **kwargs)

    monkeypatch.setattr(engine, "_fetch", counted)
    return fetched


async def set_n(node: Node, entity: EntityId, n: int) -> None:
    async with node.context().transaction() as trx:
        (await trx.edit(Card, entity)).n = n


async def test_a_live_query_on_one_node_sees_what_another_node_commits(
    pair: tuple[Node, Node],
) -> None:
    a, b = pair
    async with b.context().query(Card, "n >= 0 ORDER BY n") as live:
        entity = await create(a, "made on a")
        await until(b, lambda: _has(live.items, entity, 0))
        await set_n(a, entity, 7)
        await until(b, lambda: _has(live.items, entity, 7))
        assert [c.title for c in live.items] == ["made on a"]


async def _has(items: list[Card], entity: EntityId, n: int) -> bool:
    return any(c.id == entity and c.n == n for c in items)


async def test_a_resident_entity_is_refreshed_so_the_next_commit_builds_on_the_other_node(
    pair: tuple[Node, Node],
) -> None:
    a, b = pair
    entity = await create(a, "t")
    await until(b, lambda: _n(b, entity, 0))
    await set_n(b, entity, 1)  # b holds the entity in memory from now on
    await until(a, lambda: _n(a, entity, 1))
    await set_n(a, entity, 2)
    await until(b, lambda: _n(b, entity, 2))
    assert b.resident_state(entity) is not None, "b's resident was refreshed, not dropped"
    view_a = await a.context().get(Card, entity)
    view_b = await b.context().get(Card, entity)
    assert view_a.head == view_b.head
    assert len(view_a.head) == 1, "each commit built on the other's: no fork"


async def _n(node: Node, entity: EntityId, n: int) -> bool:
    try:
        return (await node.context().get(Card, entity)).n == n
    except EntityNotFound:
        return False


async def test_a_client_of_one_node_sees_what_another_node_commits(
    pair: tuple[Node, Node],
) -> None:
    a, b = pair
    entity = await create(a, "t")
    client = await Node.open(MemoryStorage(), durable=False)
    try:
        async with InProcessServer(b) as server:
            server.connect(client)
            await client.wait_ready(timeout=10)
            async with client.context().query(Card, "") as live:
                await until(client, lambda: _has(live.items, entity, 0))
                for n in range(1, 6):
                    await set_n(a, entity, n)
                    await until(client, lambda n=n: _has(live.items, entity, n))  # type: ignore[misc]
    finally:
        await client.close()


async def test_two_nodes_committing_to_one_entity_a_thousand_times_lose_no_head_and_orphan_no_event(
    pg_schemas: PostgresSchemas,
) -> None:
    a, b, storage, _ = await open_pair(pg_schemas)
    try:
        entity = await create(a, "contended")
        await until(b, lambda: _n(b, entity, 0))

        async def writer(node: Node, name: str, count: int) -> None:
            for i in range(count):
                async with node.context().transaction() as trx:
                    card = await trx.edit(Card, entity)
                    card.n = i
                    card.title = f"{name}{i}"

        sides = (("a", a), ("b", b))
        await asyncio.gather(
            *(writer(node, f"{s}{t}.", 125) for s, node in sides for t in range(4))
        )
        events = await storage.events_of(entity)
        assert len(events) == 1 + 1000
        stored = await storage.get_state(entity)
        assert stored is not None
        parents = {p for e in events for p in e.parent}
        maximal = {e.id for e in events if e.id not in parents}
        assert set(stored.state.head) == maximal, "a head was lost or an event orphaned"
        replayed = replay(events)
        assert stored.state.head == replayed.head
        assert stored == replayed.to_state(), "the stored state is not that of its events"
        for node in (a, b):
            await until(node, lambda node=node: _at(node, entity, stored.state.head))  # type: ignore[misc]
            view = await node.context().get(Card, entity)
            assert (view.n, view.title) == (replayed.values()["n"], replayed.values()["title"])
    finally:
        await a.close()
        await b.close()


async def _at(node: Node, entity: EntityId, head: Clock) -> bool:
    state = node.resident_state(entity)
    return state is None or state.state.head == head


def replay(events: list[AdmittedEvent]) -> Entity:
    """The entity rebuilt from its events alone (parents first)."""
    entity = Entity.empty(events[0].entity_id, events[0].collection)
    applied = []
    for event in events:
        entity.apply(event)
        applied.append(event)
    entity.set_head(head_after({}, applied))
    return entity


async def behind(schemas: PostgresSchemas) -> tuple[Node, Node, PostgresStorage, EntityId]:
    """Nodes a and b on one schema, and an entity b holds at its genesis while a commits
    on it: b hears of nothing (its follower is stopped, so nothing evicts or refreshes
    what it holds: a follower that missed the NOTIFY is there for a moment)."""
    schema = schemas.new_schema()
    a = await Node.open(await PostgresStorage(schemas.dsn, schema=schema).open(), durable=True)
    await a.create_system()
    entity = await create(a, "t")
    deaf = PostgresStorage(schemas.dsn, schema=schema, listen=False, poll_interval=600)
    b = await Node.open(await deaf.open(), durable=True)
    (following,) = [t for t in b._tasks if "FeedFollower.run" in repr(t.get_coro())]
    following.cancel()
    assert (await b.context().get(Card, entity)).n == 0  # b holds it at the genesis
    await set_n(a, entity, 1)
    return a, b, deaf, entity


async def test_a_commit_planned_on_a_stale_head_is_joined_with_the_one_it_missed(
    pg_schemas: PostgresSchemas,
) -> None:
    a, b, deaf, entity = await behind(pg_schemas)
    try:
        async with b.context().transaction() as trx:  # planned on the genesis: stale
            (await trx.edit(Card, entity)).title = "from b"
        stored = await deaf.get_state(entity)
        assert stored is not None
        assert len(stored.state.head) == 2, "both heads kept"
        events = await deaf.events_of(entity)
        assert stored == replay(events).to_state()
        await until(a, lambda: _joined(a, entity))  # (b's follower, which would, is stopped)
    finally:
        await a.close()
        await b.close()


async def test_a_feed_batch_reads_each_event_its_rows_heads_name_once(
    pg_schemas: PostgresSchemas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of one entity share most of their heads (a, then a joined with b): the batch
    reads each event once. Joined per row, a 1,000-row batch over a few busy entities
    fetched and decoded 30,000 events (170 MiB held at a W3 server's peak) for about
    1,000 distinct ones."""
    a, b, deaf, entity = await behind(pg_schemas)
    try:
        async with b.context().transaction() as trx:  # planned on the genesis: joined
            (await trx.edit(Card, entity)).title = "from b"
        fetched: list[tuple[Any, ...]] = []
        fetch = deaf._fetch

        async def kept(name: str, *args: Any, **kwargs: Any) -> Any:
            rows = await fetch(name, *args, **kwargs)
            fetched.extend(rows if name == "feed_heads" else [])
            return rows

        monkeypatch.setattr(deaf, "_fetch", kept)
        deaf._recent.forget_entities(frozenset([entity]))
        rows = await deaf.read_feed(0, collections={"cards"})
        heads = [set(row.head) for row in rows if row.entity_id == entity]
        assert [len(h) for h in heads] == [1, 1, 2], "genesis, a's commit, joined with b's"
        read = [bytes(r[4]) for r in fetched if r[0] is None]
        assert sorted(read) == sorted(set().union(*heads)), "each named event, once"
        assert len(read) < sum(len(h) for h in heads)
    finally:
        await a.close()
        await b.close()


async def test_a_commit_resent_to_a_node_behind_on_it_is_joined_into_the_stored_state(
    pg_schemas: PostgresSchemas,
) -> None:
    """A client failing over pushes its commit again to another server, which stored it
    meanwhile through the first one but holds the entity from before: the resent commit is
    on the head that server holds, so it is planned without a lookup, and the write's join
    makes it the no-op it is."""
    a, b, deaf, entity = await behind(pg_schemas)
    try:
        stored = await deaf.get_state(entity)
        event = (await deaf.events_of(entity))[-1]
        result = await b._commit_remote([[event.event]], lambda *_: None)  # the server's path
        assert [e.id for e in result.stored] == [event.id]  # planned as new on b's head
        assert await deaf.get_state(entity) == stored, "joined: the state is the one a stored"
        assert [e.id for e in await deaf.events_of(entity)][-1] == event.id
        assert len(await deaf.events_of(entity)) == 2, "no event twice"
        view = await b.context().get(Card, entity)
        assert (view.n, view.head) == (1, Clock([event.id]))
    finally:
        await a.close()
        await b.close()


async def _joined(node: Node, entity: EntityId) -> bool:
    view = await node.context().get(Card, entity)
    return (view.n, view.title, len(view.head)) == (1, "from b", 2)


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


@pytest.mark.parametrize("said", [True, False], ids=["said-whole", "rows-only"])
async def test_another_process_s_commit_costs_a_follower_one_query_or_none(
    pg_schemas: PostgresSchemas, monkeypatch: pytest.MonkeyPatch, said: bool
) -> None:
    """A commit whose notification says its rows and the events their heads name costs
    the follower no query; one that says less (a big write, an older engine), one query
    for the rows and those events together (before: the rows, then the events, two
    round trips for every batch)."""
    if not said:
        monkeypatch.setattr(postgres_write, "notice", lambda w, rows, events=(): notice(w, rows))
    a, b, _, second = await open_pair(pg_schemas)
    try:
        entity = await create(a, "theirs")
        live = await b.context().query(Card, "").__aenter__()  # resident on b: refreshed
        shown = -1

        async def shows() -> bool:
            return [c.n for c in live.items] == [shown]

        shown = 0
        await until(b, shows)
        fetched = queries_of(second, monkeypatch)
        for shown in range(1, 11):
            await set_n(a, entity, shown)
            await until(b, shows)
        await live.close()
        assert ("feed_heads" in fetched) is not said
        assert [f for f in fetched if f in ("feed", "events", "ahead")] == []
    finally:
        await a.close()
        await b.close()


async def test_following_its_own_commits_costs_a_node_no_query(
    pg_schemas: PostgresSchemas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine answers the follower's read of rows it wrote itself from memory, and its
    wait, while listening, without a query (before: two feed reads and a clock read per
    commit, on every server, for every commit it made); and the commits ask storage for
    nothing before they write (before: a lookup of their own new ids each)."""
    a, b, first, second = await open_pair(pg_schemas)
    try:
        entity = await create(a, "mine")
        follower = a._feed
        assert follower is not None
        fetched = queries_of(first, monkeypatch)
        for n in range(1, 21):
            await set_n(a, entity, n)
        last = await second.last_offset()

        async def caught_up() -> bool:
            return follower.offset == last

        await until(a, caught_up)
        assert [f for f in fetched if f in ("feed", "last")] == [], "it read its own rows back"
        assert [f for f in fetched if f in ("events", "ahead")] == [], (
            "a local commit on the head held here looks nothing up before its write"
        )
        live = await b.context().query(Card, "").__aenter__()  # the other node reads them

        async def shows_20() -> bool:
            return [c.n for c in live.items] == [20]

        await until(b, shows_20)
        await live.close()
    finally:
        await a.close()
        await b.close()


async def test_a_node_that_shows_none_of_a_commits_collections_follows_it_without_a_query(
    pg_schemas: PostgresSchemas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit's NOTIFY says its feed rows: a node nobody watches their collection
    through evicts their entities and moves on without reading the feed (before: one
    query per commit, on every such server)."""
    a, b, _, second = await open_pair(pg_schemas)
    try:
        entity = await create(a, "theirs")
        assert (await b.context().get(Card, entity)).n == 0  # resident on b now
        flags = await b.context().query(Flag, "").__aenter__()
        assert b._shows() == {"flags"}
        fetched = queries_of(second, monkeypatch)
        for n in range(1, 11):
            await set_n(a, entity, n)
        async with a.context().transaction() as trx:
            trx.create(Flag)  # after the cards in the feed: b has followed them once it shows

        async def flagged() -> bool:
            return len(flags.items) == 1

        await until(b, flagged)
        await flags.close()
        feed = [f for f in fetched if f in ("feed", "feed_heads", "last", "events")]
        assert feed == [], "the flag's row and its event came in its notification"
        assert (await b.context().get(Card, entity)).n == 10, "b read the stored state"
    finally:
        await a.close()
        await b.close()


async def test_rows_heard_are_the_stored_ones_and_a_gap_among_them_is_read(
    pg_schemas: PostgresSchemas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows known from notifications are the feed's own (as a query reads them), used only
    as a run with no gap: a row not heard (a lost notification) is read from the feed."""
    a, b, _, engine = await open_pair(pg_schemas)
    reader = await PostgresStorage(pg_schemas.dsn, schema=engine.schema, listen=False).open()
    second = await PostgresStorage(pg_schemas.dsn, schema=engine.schema).open()  # no node on it
    try:
        start = await reader.last_offset()
        entities = [await create(a, f"card {i}") for i in range(4)]
        await set_n(a, entities[0], 1)
        last = await reader.last_offset()
        listener = second._listener
        # notifications arrive in commit order on one connection: once the last is heard,
        # so are those before it (waiting on a's commits instead raced them: CI, stop 31)
        assert await listener.wait(last - 1, timeout=10), "the last commit was notified"
        heard = listener.heard
        assert all(o in heard for o in range(start + 1, last + 1))
        stored = await reader.read_feed(start, collections=set())
        assert [r.offset for r in stored] == list(range(start + 1, last + 1))
        fetched = queries_of(second, monkeypatch)
        assert await second.read_feed(start, collections=set()) == stored
        assert await second.read_since(start) == stored
        assert fetched == [], "both from what was heard"
        assert await second.read_feed(start, collections={"cards"}) == stored
        assert fetched == [], "rows of a shown collection whose heads' events were heard"
        second._recent.forget_entities(frozenset(entities))
        assert await second.read_feed(start, collections={"cards"}) == stored
        assert fetched == ["feed_heads"], "shown rows, their events not held: read with them"
        del heard[start + 3]  # as if its notification was lost
        assert await second.read_feed(start, collections=set()) == stored[:2]
        assert await second.read_feed(start + 2, collections=set()) == stored[2:]
        assert fetched == ["feed_heads"] * 2, "the gap was read"
    finally:
        await reader.close()
        await second.close()
        await a.close()
        await b.close()
