"""PostgresStorage beyond the shared suite: several processes, the feed, migrations."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import psycopg
import pytest
from psycopg import sql

from mycelia import Node
from mycelia.errors import StorageError, StorageNotFound
from mycelia.proto import AdmittedEvent, Clock, EntityId
from mycelia.proto.query import parse
from mycelia.retrieval import WriteBatch
from mycelia.storage.postgres import SCHEMA_VERSION, PostgresStorage
from mycelia.storage.testing import History, engine_content, state_of
from tests.storage.conftest import PostgresSchemas
from tests.storage.crash_child import Counter
from tests.storage.test_crash import REPO

pytestmark = pytest.mark.postgres

COMMIT_ONE = """
import asyncio, sys
from mycelia import Node
from mycelia.storage.postgres import PostgresStorage
from tests.storage.crash_child import Counter

async def main():
    node = await Node.open(PostgresStorage(sys.argv[1], schema=sys.argv[2]), durable=True)
    async with node.context().transaction() as trx:
        print(trx.create(Counter, worker=1, n=42).id, flush=True)
    await node.close()

asyncio.run(main())
"""


async def test_a_commit_in_another_process_is_visible_and_wakes_the_feed(
    pg_schemas: PostgresSchemas,
) -> None:
    schema = pg_schemas.new_schema()
    # A poll interval far beyond the wait: only the NOTIFY can wake this reader in time.
    storage = await PostgresStorage(pg_schemas.dsn, schema=schema, poll_interval=600).open()
    node = await Node.open(storage, durable=True)
    await node.create_system()
    offset = await storage.last_offset()
    try:
        waiting = asyncio.ensure_future(storage.wait_for_feed(offset, timeout=60))
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", COMMIT_ONE, pg_schemas.dsn, schema,
            cwd=REPO, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(child.communicate(), 60)
        assert child.returncode == 0
        assert await asyncio.wait_for(waiting, 30)  # woken long before any poll
        entity = EntityId.from_base64(out.decode().strip())
        assert (await node.context().get(Counter, entity)).n == 42
        rows = await storage.read_since(offset)
        assert [r.entity_id for r in rows] == [entity]
    finally:
        await node.close()


async def test_without_notify_the_feed_is_still_seen_by_polling(
    pg_schemas: PostgresSchemas,
) -> None:
    schema = pg_schemas.new_schema()
    writer = await PostgresStorage(pg_schemas.dsn, schema=schema).open()
    reader = await PostgresStorage(
        pg_schemas.dsn, schema=schema, listen=False, poll_interval=0.05
    ).open()
    try:
        waiting = asyncio.ensure_future(reader.wait_for_feed(0, timeout=30))
        h = History.make()
        await writer.write(WriteBatch((h.g,), (state_of([h.g]),)))
        assert await asyncio.wait_for(waiting, 30)
    finally:
        await writer.close()
        await reader.close()


@pytest.mark.parametrize("at_once", [False, True], ids=["pipelined", "write_batch"])
async def test_concurrent_writers_in_two_engines_never_make_a_reader_skip(
    pg_schemas: PostgresSchemas, at_once: bool
) -> None:
    schema = pg_schemas.new_schema()
    engines = [
        await PostgresStorage(pg_schemas.dsn, schema=schema, max_connections=6).open()
        for _ in range(3)
    ]
    total = 120
    histories = [History.make(n=i) for i in range(total)]
    seen: list[int] = []
    done = asyncio.Event()

    async def read_continuously() -> None:
        while len(seen) < total:
            rows = await engines[2].read_since(seen[-1] if seen else 0)
            offsets = [r.offset for r in rows]
            start = seen[-1] + 1 if seen else 1
            assert offsets == list(range(start, start + len(offsets))), "the reader skipped"
            seen.extend(offsets)
            if not rows:
                await engines[2].wait_for_feed(start - 1, timeout=5)
        done.set()

    reader = asyncio.ensure_future(read_continuously())
    try:
        writes = [
            engines[i % 2].write(
                WriteBatch(
                    (h.g,), (state_of([h.g]),), bases={h.entity_id: Clock()} if at_once else {}
                )
            )
            for i, h in enumerate(histories)
        ]
        results = await asyncio.gather(*writes)
        assert sorted(o for r in results for o in r.offsets) == list(range(1, total + 1))
        await asyncio.wait_for(done.wait(), 30)
        await reader
    finally:
        reader.cancel()
        for engine in engines:
            await engine.close()


async def test_a_batch_made_on_the_stored_heads_is_one_statement_and_stores_the_same(
    pg_schemas: PostgresSchemas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches that name the stored head each state was made on are written by
    ``write_batch`` in one statement; one whose base is not the stored head any more (a
    concurrent writer's) falls back to the row-locked write, which joins what it can read
    (these synthetic states it stores as written). Either way the engine ends up holding
    what the pipelined write alone stores: events, states, field index and feed."""
    h = History.make()
    empty, g, a = Clock(), Clock([h.g.id]), Clock([h.a.id])
    batches: list[tuple[AdmittedEvent, dict[str, object], Clock]] = [
        (h.g, {"v": 0}, empty),
        (h.a, {"v": 1}, g),
        (h.c, {"v": 2}, a),
        (h.b, {"v": 3}, g),  # made on g, but c is stored: the row-locked write
        (h.m, {"v": 4}, Clock([h.b.id])),
    ]
    contents, fetched = [], []
    for at_once in (False, True):
        engine = await PostgresStorage(pg_schemas.dsn, schema=pg_schemas.new_schema()).open()
        single: list[bool] = []
        real = engine._writer._write_at_once

        async def counted(*args: Any, real: Any = real, single: list[bool] = single) -> Any:
            done = await real(*args)
            single.append(done is not None)
            return done

        monkeypatch.setattr(engine._writer, "_write_at_once", counted)
        try:
            for event, values, base in batches:
                bases = {h.entity_id: base} if at_once else {}
                state = state_of([event], values)
                await engine.write(WriteBatch((event,), (state,), bases=bases))
            contents.append(await engine_content(engine))
            fetched.append([s.values for s in await engine.fetch("items", parse("v >= 0"))])
        finally:
            await engine.close()
        assert single == ([True, True, True, False, True] if at_once else [])
    assert contents[0] == contents[1]
    assert fetched[0] == fetched[1] == [{"v": 4}]


async def test_engines_opening_together_migrate_once(pg_schemas: PostgresSchemas) -> None:
    schema = pg_schemas.new_schema()
    engines = await asyncio.gather(
        *(PostgresStorage(pg_schemas.dsn, schema=schema).open() for _ in range(6))
    )
    for engine in engines:
        await engine.close()
    with psycopg.connect(pg_schemas.dsn) as conn:
        rows = conn.execute(
            sql.SQL("SELECT version FROM {}.version").format(sql.Identifier(schema))
        ).fetchall()
        assert rows == [(SCHEMA_VERSION,)]
        conn.execute(sql.SQL("UPDATE {}.version SET version = 99").format(sql.Identifier(schema)))
    with pytest.raises(StorageError, match="version 99"):
        await PostgresStorage(pg_schemas.dsn, schema=schema).open()


async def test_an_unopened_engine_opens_on_first_use(pg_schemas: PostgresSchemas) -> None:
    storage = PostgresStorage(pg_schemas.dsn, schema=pg_schemas.new_schema())
    node = await Node.open(storage, durable=True)
    try:
        root = await node.create_system()
        assert await storage.get_meta("system_root") == bytes(root)
    finally:
        await node.close()
    with pytest.raises(StorageError):
        await storage.get_meta("system_root")


async def test_bad_schema_names_and_unreachable_servers_are_typed_errors() -> None:
    with pytest.raises(StorageError):
        PostgresStorage("postgresql://127.0.0.1:1/x", schema="Robert'); DROP TABLE x;--")
    unreachable = PostgresStorage("postgresql://127.0.0.1:1/x", connect_timeout=1)
    with pytest.raises(StorageError):
        await unreachable.open()


def schema_exists(dsn: str, schema: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name = %s", (schema,)
        ).fetchone()
    return bool(row and row[0])


async def test_an_open_that_may_not_create_refuses_a_missing_schema_and_creates_none(
    pg_schemas: PostgresSchemas,
) -> None:
    schema = pg_schemas.new_schema()
    with pytest.raises(StorageNotFound, match="no Mycelia store"):
        await PostgresStorage(pg_schemas.dsn, schema=schema, create=False).open()
    assert not schema_exists(pg_schemas.dsn, schema)
    made = await PostgresStorage(pg_schemas.dsn, schema=schema).open()
    await made.write(WriteBatch(meta=(("k", b"v"),)))
    await made.close()
    reader = await PostgresStorage(pg_schemas.dsn, schema=schema, create=False).open()
    try:
        assert await reader.get_meta("k") == b"v"
    finally:
        await reader.close()


async def test_concurrent_writes_share_a_statement_and_each_gets_its_own_result(
    pg_schemas: PostgresSchemas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit: writes in flight together are one ``write_batch`` statement, and each
    gets its own new events and a run of offsets. When the group's statement writes
    nothing (here a stored head moved under one member), each member is written alone:
    that one joins, the others are written as they would have been; the engine holds what
    the same writes made one at a time store."""
    histories = [History.make(n=i) for i in range(12)]
    stale = histories[0]

    def genesis_batch(h: History) -> WriteBatch:
        return WriteBatch((h.g,), (state_of([h.g]),), bases={h.entity_id: Clock()})

    stale_batch = WriteBatch((stale.a,), (state_of([stale.a]),), bases={stale.entity_id: Clock()})
    contents = []
    for together in (False, True):
        engine = await PostgresStorage(pg_schemas.dsn, schema=pg_schemas.new_schema()).open()
        statements: list[list[Any]] = []
        real = engine._writer._groups._run

        async def counted(
            params: list[Any], real: Any = real, statements: list[list[Any]] = statements
        ) -> Any:
            statements.append(params)
            return await real(params)

        monkeypatch.setattr(engine._writer._groups, "_run", counted)
        try:
            first = await engine.write(genesis_batch(stale))
            rest = [genesis_batch(h) for h in histories[1:]]
            if together:
                results = await asyncio.gather(*(engine.write(b) for b in rest))
                assert 1 < len(statements) < 1 + len(rest), "they shared statements"
                assert [r.new_events for r in results] == [{h.g.id} for h in histories[1:]]
                offsets = sorted(o for r in results for o in r.offsets)
                assert offsets == list(range(first.offsets[-1] + 1, first.offsets[-1] + 12))
                statements.clear()
                more = [genesis_batch(History.make(n=i)) for i in range(12, 15)]
                await asyncio.gather(*(engine.write(b) for b in [stale_batch, *more]))
                assert len(statements) == 1 + 4, "the group, then each alone (one moved)"
            else:
                for batch in [*rest, stale_batch]:
                    await engine.write(batch)
                for i in range(12, 15):
                    await engine.write(genesis_batch(History.make(n=i)))
            content = await engine_content(engine)
            contents.append(sorted(map(repr, content[:-2])))  # the feed's order may differ
        finally:
            await engine.close()
    assert contents[0] == contents[1]
