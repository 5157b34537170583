"""``fetch`` on every engine: the shared query case file, and each engine's pushdown.

The case file (``tests/proto/query/cases.json``) is the contract of ARCHITECTURE.md §8:
every engine loads its rows (row id N is the entity id ``bytes([N]) * 32``) and must return
each case's expected ids, in order.
"""

from __future__ import annotations

import json
import tracemalloc
from dataclasses import replace
from pathlib import Path
from typing import Any

import lmdb
import psycopg
import pytest
from psycopg import sql

from mycelia.errors import InvalidArgument, StorageCorrupt, StorageReadOnly
from mycelia.proto import EntityId, EntityState, State
from mycelia.proto.query import After, And, IsNull, Query, parse
from mycelia.retrieval import StoredState, WriteBatch
from mycelia.storage import MemoryStorage, StorageEngine
from mycelia.storage.lmdb import LARGE_READ, LmdbStorage
from mycelia.storage.lmdb_index import OverBudget, fetch_in
from mycelia.storage.plan import plan_query
from mycelia.storage.testing import EngineSpec, genesis, state_of
from mycelia.storage.testing_queries import fetch_matches_scan, fetch_pages
from tests.proto.query.test_cases import CASES_FILE
from tests.storage.conftest import PostgresSchemas

_DATA: dict[str, Any] = json.loads(CASES_FILE.read_text(encoding="utf-8"))


def case_row(n: int, values: dict[str, object], collection: str = "cases") -> StoredState:
    """Row ``n`` of the case file as a stored state of entity ``bytes([n]) * 32``."""
    head = genesis(collection, n)
    state = State.of(head={head.id: 1}, buffers={})
    return StoredState(EntityState(EntityId._trusted(bytes([n]) * 32), collection, state), values)


def live_only(query: Query) -> Query:
    """What the node asks for: the query restricted to entities without a tombstone."""
    return Query(And((query.predicate, IsNull(("_deleted",)))), query.order_by, query.limit)


async def test_every_engine_returns_each_case_of_the_shared_file(engine_spec: EngineSpec) -> None:
    engine = await engine_spec.fresh()
    try:
        rows = tuple(case_row(row["id"], row["values"]) for row in _DATA["rows"])
        # A neighbouring collection with the same fields must never leak into results.
        noise = tuple(case_row(100 + row["id"], row["values"], "noise") for row in _DATA["rows"])
        await engine.write(WriteBatch(states=rows + noise))
        wrong = []
        for case in _DATA["cases"]:
            query = parse(case["query"]).bind(*case["args"])
            for each in (query, live_only(query)):
                got = [s.state.entity_id[0] for s in await engine.fetch("cases", each)]
                if got != case["expected"]:
                    wrong.append(f"{each}: got {got}, expected {case['expected']}")
        assert not wrong, f"{engine_spec.name} disagrees with the case file:\n" + "\n".join(wrong)
    finally:
        await engine.close()


async def test_fetch_refuses_an_unbound_query_on_every_engine(engine_spec: EngineSpec) -> None:
    engine = await engine_spec.fresh()
    try:
        with pytest.raises(InvalidArgument):
            await engine.fetch("items", parse("x > ? ORDER BY x LIMIT 3"))
    finally:
        await engine.close()


async def test_descending_ties_come_in_id_order_across_a_limit(engine_spec: EngineSpec) -> None:
    engine = await engine_spec.fresh()
    try:
        states = tuple(state_of([genesis("items", n)], {"x": n % 3}) for n in range(30))
        await engine.write(WriteBatch(states=states))
        for limit in (1, 5, 10, 11, 25, 40):
            for text in ("x >= 0 ORDER BY x DESC", "x IN (0, 2) ORDER BY x DESC"):
                query = parse(f"{text} LIMIT {limit}")
                got = await fetch_matches_scan(engine, "items", query, name=engine_spec.name)
                assert len(got) == min(limit, 30 if "IN" not in text else 20)
    finally:
        await engine.close()


async def test_an_ordered_walk_past_many_rejected_rows_is_exact(engine_spec: EngineSpec) -> None:
    engine = await engine_spec.fresh()
    try:
        states = tuple(
            state_of([genesis("items", n)], {"x": n // 4, "g": n % 10}) for n in range(600)
        )
        await engine.write(WriteBatch(states=states))
        for text in (
            "x >= 3 AND g = 7 ORDER BY x LIMIT 5",
            "x < 140 AND g = 7 ORDER BY x DESC LIMIT 12",
            "x IN (1, 50, 149) AND g > 5 ORDER BY x DESC LIMIT 3",
            "x > 0 AND g = 99 ORDER BY x LIMIT 1",
        ):
            await fetch_matches_scan(engine, "items", parse(text), name=engine_spec.name)
    finally:
        await engine.close()


@pytest.mark.postgres
async def test_a_schema_1_database_gets_its_field_index_when_migrated(
    pg_schemas: PostgresSchemas,
) -> None:
    from mycelia.storage.postgres import SCHEMA_VERSION, PostgresStorage  # noqa: PLC0415

    schema = pg_schemas.new_schema()
    storage = await PostgresStorage(pg_schemas.dsn, schema=schema).open()
    states = tuple(state_of([genesis("items", n)], {"x": n, "s": str(n)}) for n in range(50))
    await storage.write(WriteBatch(states=states))
    await storage.close()
    async with await psycopg.AsyncConnection.connect(pg_schemas.dsn, autocommit=True) as conn:
        s = sql.Identifier(schema)
        await conn.execute(sql.SQL("DROP TABLE {}.field_keys").format(s))
        await conn.execute(sql.SQL("UPDATE {}.version SET version = 1").format(s))
    storage = await PostgresStorage(pg_schemas.dsn, schema=schema).open()
    try:
        query = parse("x >= 40 ORDER BY x DESC LIMIT 3")
        assert [s.values["x"] for s in await storage.fetch("items", query)] == [49, 48, 47]
        await fetch_matches_scan(storage, "items", parse("s = '7'"), name="postgres")
        async with await psycopg.AsyncConnection.connect(pg_schemas.dsn) as conn:
            cursor = await conn.execute(sql.SQL("SELECT version FROM {}.version").format(s))
            assert await cursor.fetchall() == [(SCHEMA_VERSION,)]
    finally:
        await storage.close()


async def lmdb_with_rows(path: Path, count: int, *, batch: int = 5000) -> LmdbStorage:
    storage = LmdbStorage(path, durable=False, map_size=1 << 28)
    for start in range(0, count, batch):
        states = tuple(
            state_of([genesis("rows", n)], {"x": (n * 7919) % count - count // 2, "g": n % 10})
            for n in range(start, min(count, start + batch))
        )
        await storage.write(WriteBatch(states=states))
    return storage


async def test_a_fetch_with_many_candidates_is_exact_past_the_inline_budget(
    tmp_path: Path,
) -> None:
    storage = await lmdb_with_rows(tmp_path / "s", 3 * LARGE_READ)
    try:
        large = parse("x > -100000 ORDER BY x")
        with pytest.raises(OverBudget):  # so fetch redoes it in a worker thread
            storage._read(
                lambda txn: fetch_in(
                    txn, storage._dbs, "rows", large, plan=plan_query(large), budget=LARGE_READ
                )
            )
        for query in (large, parse("g = 3 ORDER BY x DESC"), parse("x > 0 AND g != 1"), Query()):
            await fetch_matches_scan(storage, "rows", query, name="lmdb")
        small = await storage.fetch("rows", parse("x >= 0 ORDER BY x LIMIT 20"))
        assert [s.values["x"] for s in small] == list(range(20))
    finally:
        await storage.close()


async def test_an_lmdb_limit_ranked_by_a_scan_holds_about_its_limits_rows(
    tmp_path: Path,
) -> None:
    # ORDER BY a field no predicate restricts: every row is ranked. Before, each was kept
    # whole until the sort (30 such answers over 40 MB took a server from 0.36 to 1.2 GB).
    storage = LmdbStorage(tmp_path / "s", durable=False, map_size=1 << 28)
    try:
        blob = "b" * 100_000
        rows = tuple(state_of([genesis("rows", n)], {"n": n, "blob": blob}) for n in range(60))
        await storage.write(WriteBatch(states=rows))
        del rows
        tracemalloc.start()
        try:
            top = await storage.fetch("rows", parse("ORDER BY n DESC LIMIT 2"))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert [s.values["n"] for s in top] == [59, 58]
        assert peak < 1_000_000, f"ranking 60 rows of 100 KB for 2 held {peak} bytes"
    finally:
        await storage.close()


async def test_a_layout_1_store_is_migrated_by_a_writable_open(tmp_path: Path) -> None:
    states = tuple(state_of([genesis("items", n)], {"x": n, "s": str(n)}) for n in range(50))
    storage = LmdbStorage(tmp_path / "s", durable=False)
    await storage.write(WriteBatch(states=states))
    await storage.close()
    env = lmdb.open(str(tmp_path / "s"), max_dbs=8)  # back to layout 1: no field index
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(b"by_field", txn=txn), delete=True)
        txn.put(b"format", b"1", db=env.open_db(b"engine", txn=txn))
    env.close()
    with pytest.raises(StorageReadOnly, match="layout version 1"):
        LmdbStorage(tmp_path / "s", readonly=True)
    storage = LmdbStorage(tmp_path / "s", durable=False)
    try:
        query = parse("x >= 40 ORDER BY x DESC LIMIT 3")
        await fetch_matches_scan(storage, "items", query, name="lmdb")
        assert [s.values["x"] for s in await storage.fetch("items", query)] == [49, 48, 47]
        await storage.write(WriteBatch(states=(state_of([genesis("items", 48)], {"x": 1}),)))
        assert [s.values["x"] for s in await storage.fetch("items", query)] == [49, 47, 46]
    finally:
        await storage.close()


async def test_an_index_naming_a_missing_state_is_corrupt_and_a_scan_skips_nothing_else(
    tmp_path: Path,
) -> None:
    """A ``by_field`` entry whose state is gone is damage (StorageCorrupt), not a shorter
    result; a collection scan over the same store still returns every state it holds."""
    states = tuple(state_of([genesis("items", n)], {"x": n}) for n in range(20))
    storage = LmdbStorage(tmp_path / "s", durable=False)
    await storage.write(WriteBatch(states=states))
    await storage.close()
    gone = states[7].state.entity_id
    env = lmdb.open(str(tmp_path / "s"), max_dbs=8)
    with env.begin(write=True) as txn:
        assert txn.delete(bytes(gone), db=env.open_db(b"states", txn=txn))
    env.close()
    storage = LmdbStorage(tmp_path / "s", durable=False)
    try:
        with pytest.raises(StorageCorrupt, match="names a missing state"):
            await storage.fetch("items", parse("x >= 5"))
        rest = await storage.fetch("items", parse(""))  # no plan: the collection walk
        assert sorted(s.state.entity_id for s in rest) == sorted(
            s.state.entity_id for s in states if s.state.entity_id != gone
        )
    finally:
        await storage.close()


async def test_keyset_pages_in_a_plans_order_are_exact_across_ties(
    engine_spec: EngineSpec,
) -> None:
    """A result read a page at a time from each page's last row (``After.row``) is the
    whole result, in order, whatever the order: ascending or descending on the planned
    field (many rows per key: a page ends inside a key's run of ids), by id, or by an
    unplanned field; and with neither a plan nor ORDER BY (LMDB then returns the ids in
    the order it read them, after the page's last one)."""
    engine = await engine_spec.fresh()
    try:
        states = tuple(
            state_of([genesis("items", n)], {"x": n % 7, "s": f"{n % 5}"}) for n in range(150)
        )
        await engine.write(WriteBatch(states=states))
        for text in (
            "x >= 2 ORDER BY x",
            "x >= 2 ORDER BY x DESC",
            "x IN (1, 3, 6) ORDER BY x",
            "x IN (1, 3, 6) ORDER BY x DESC",
            "x < 4",
            "x > 0 ORDER BY s DESC",
            "",
            "x = 1 OR s = '2'",
        ):
            query = parse(text)
            whole = await fetch_matches_scan(engine, "items", query, name=engine_spec.name)
            for size in (1, 7, 40):
                paged = await fetch_pages(engine, "items", query, size=size)
                assert paged == whole, f"{engine_spec.name}: {text} in pages of {size}"
    finally:
        await engine.close()


async def test_a_page_of_an_ordered_plan_reads_from_its_position(tmp_path: Path) -> None:
    """An ordered plan's walk starts at the position, so a page deep into a large result
    reads about its own candidates (a budget of 64 is not exceeded), also from inside one
    key's long run of ids: the index key is the value key, then the id."""
    storage = await lmdb_with_rows(tmp_path / "s", 3 * LARGE_READ)
    try:
        for text in ("x > -100000 ORDER BY x", "g = 3 ORDER BY g", "g >= 3 ORDER BY g"):
            query = parse(text)
            whole = await storage.fetch("rows", query)
            middle = len(whole) // 2
            last = whole[middle]
            after = After.row(query, last.state.entity_id, last.values)
            page = replace(query, limit=20)

            def read(txn: Any, page: Query = page, after: After = after) -> list[StoredState]:
                plan = plan_query(page)
                return fetch_in(txn, storage._dbs, "rows", page, plan=plan, budget=64, after=after)

            found = storage._read(read)
            wanted = whole[middle + 1 : middle + 21]
            assert [s.state.entity_id for s in found] == [s.state.entity_id for s in wanted]
    finally:
        await storage.close()


@pytest.mark.slow
async def test_a_range_fetch_over_100000_entities_reads_the_index_not_the_rows(
    tmp_path: Path,
) -> None:
    """``ORDER BY x LIMIT 20`` over a range of 1,000 of 100,000 rows reads about its 20
    rows: within a budget of 32 candidates, which a scan or a read of the whole range
    would exceed (the speed is ``benches/bench_queries.py``'s, not a timed test's)."""
    storage = await lmdb_with_rows(tmp_path / "s", 100_000)
    try:
        query = parse("x > ? AND x < ? ORDER BY x LIMIT 20")
        for low in range(-50_000, 50_000, 5_000):
            bound = query.bind(low, low + 1000)

            def read(txn: Any, bound: Query = bound) -> list[StoredState]:
                plan = plan_query(bound)
                return fetch_in(txn, storage._dbs, "rows", bound, plan=plan, budget=32)

            found = storage._read(read)
            assert [s.values["x"] for s in found] == list(range(low + 1, low + 21))
            assert found == await storage.fetch("rows", bound)
    finally:
        await storage.close()


async def test_memory_fetch_is_the_reference_executor() -> None:
    engine: StorageEngine = MemoryStorage()
    states = tuple(state_of([genesis("items", n)], {"x": -n, "y": [n]}) for n in range(10))
    await engine.write(WriteBatch(states=states))
    found = await engine.fetch("items", parse("x > -5 ORDER BY y DESC LIMIT 2"))
    assert [s.values["x"] for s in found] == [-4, -3]
