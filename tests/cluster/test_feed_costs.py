"""What following the feed costs a node in queries: a feed batch reads each event its rows'
heads name once; another process's commit costs a follower one query or none, its own
commits none (and nothing is looked up before they write), and a commit to collections
the node does not show none; rows known from notifications are the stored ones, used only
as a run with no gap, and a gap among them is read from the feed (ARCHITECTURE.md §6,
§7)."""

from __future__ import annotations

from typing import Any

import pytest

from mycelia import Model
from mycelia.storage import postgres_write
from mycelia.storage.postgres import PostgresStorage
from mycelia.storage.postgres_notice import notice
from tests.cluster.models import Card
from tests.cluster.nodes import behind, create, open_pair, set_n
from tests.node.waiting import until
from tests.storage.conftest import PostgresSchemas

pytestmark = pytest.mark.postgres


class Flag(Model, collection="flags"):
    """A collection apart from the cards."""

    up: bool = True


def queries_of(engine: PostgresStorage, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the statements ``engine`` runs from now on (for this test)."""
    fetched: list[str] = []
    fetch = engine._fetch

    async def counted(name: str, *args: Any, **kwargs: Any) -> Any:
        fetched.append(name)
        return await fetch(name, *args, **kwargs)

    monkeypatch.setattr(engine, "_fetch", counted)
    return fetched


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
