"""The recent events a durable engine keeps decoded (mycelia.storage.recent), and the
PostgreSQL engine reading them without a round trip."""

from __future__ import annotations

from typing import Any

import pytest

from mycelia.retrieval import WriteBatch
from mycelia.storage.postgres import PostgresStorage
from mycelia.storage.recent import RecentEvents
from mycelia.storage.testing import genesis, update
from tests.storage.conftest import PostgresSchemas


def test_it_holds_at_most_its_count_and_lets_the_oldest_go_first() -> None:
    chain = [genesis(n=1)]
    for i in range(4):
        chain.append(update([chain[-1]], b"%d" % i))
    recent = RecentEvents(events=3)
    recent.remember(chain)
    assert [e.id in recent for e in chain] == [False, False, True, True, True]
    assert recent.bytes == sum(len(e.event.to_bytes()) for e in chain[2:])


def test_a_few_large_events_push_out_many_small_ones() -> None:
    small = [genesis(n=i) for i in range(10)]
    large = update([small[0]], b"x" * 5000)
    recent = RecentEvents(max_bytes=len(large.event.to_bytes()) + len(small[9].event.to_bytes()))
    recent.remember([*small, large])
    assert [e.id for e in small if e.id in recent] == [small[9].id]
    assert large.id in recent


def test_read_names_what_it_lacks_and_reads_ahead_only_when_it_lacks_nothing() -> None:
    g = genesis(n=1)
    a = update([g], b"a")
    b = update([a], b"b")
    stranger = genesis(n=2)
    recent = RecentEvents()
    recent.remember([g, a, b])
    found, rest = recent.read([b.id], ahead=8)
    assert (set(found), rest) == ({b.id, a.id, g.id}, [])
    found, rest = recent.read([b.id, stranger.id], ahead=8)
    assert (set(found), rest) == ({b.id}, [stranger.id]), "the engine reads ahead from both"
    found, rest = recent.read([b.id], ahead=0)
    assert set(found) == {b.id}


def test_forgetting_an_entity_lets_go_of_its_events_only() -> None:
    g, other = genesis(n=1), genesis(n=2)
    a = update([g], b"a")
    recent = RecentEvents()
    recent.remember([g, a, other])
    recent.forget_entities({g.entity_id})
    assert (g.id in recent, a.id in recent, other.id in recent) == (False, False, True)
    assert recent.bytes == len(other.event.to_bytes())


@pytest.mark.postgres
async def test_postgres_reads_the_events_it_wrote_or_read_without_a_round_trip(
    pg_schemas: PostgresSchemas, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = pg_schemas.new_schema()
    writer = await PostgresStorage(pg_schemas.dsn, schema=schema).open()
    reader = await PostgresStorage(pg_schemas.dsn, schema=schema).open()
    try:
        g = genesis(n=1)
        a = update([g], b"a")
        await writer.write(WriteBatch((g, a)))
        trips = {"writer": 0, "reader": 0}
        for name, engine in (("writer", writer), ("reader", reader)):
            fetch = engine._fetch

            async def counted(*args: Any, _f: Any = fetch, _n: str = name) -> Any:
                trips[_n] += 1
                return await _f(*args)

            monkeypatch.setattr(engine, "_fetch", counted)
        assert set(await writer.get_events([a.id], ahead=4)) == {a.id, g.id}
        assert await writer.event_stored(g.id)
        assert trips["writer"] == 0, "what it wrote is at hand"
        assert set(await reader.get_events([a.id], ahead=4)) == {a.id, g.id}
        assert set(await reader.get_events([a.id], ahead=4)) == {a.id, g.id}
        assert trips["reader"] == 1, "read once, then at hand"

        await writer.write(WriteBatch(forget=(g.entity_id,)))
        assert await writer.get_events([a.id, g.id]) == {}, "a forget lets go of them first"
        assert trips["writer"] == 1
    finally:
        await writer.close()
        await reader.close()
