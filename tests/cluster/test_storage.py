"""What several processes on one PostgreSQL need from the engine: node keys by name, a
start-up lock, and a feed wake-up that survives a dropped LISTEN connection."""

from __future__ import annotations

import asyncio
import contextlib

import psycopg
import pytest

from mycelia.retrieval import WriteBatch
from mycelia.storage.postgres import PostgresStorage
from mycelia.storage.testing import History, state_of
from tests.storage.conftest import PostgresSchemas

pytestmark = pytest.mark.postgres


async def engines(schemas: PostgresSchemas, count: int, **options: float) -> list[PostgresStorage]:
    schema = schemas.new_schema()
    return [
        await PostgresStorage(schemas.dsn, schema=schema, **options).open()  # type: ignore[arg-type]
        for _ in range(count)
    ]


async def test_a_node_key_is_kept_per_name_and_the_first_one_stored_wins(
    pg_schemas: PostgresSchemas,
) -> None:
    one, two = await engines(pg_schemas, 2)
    try:
        keys = await asyncio.gather(
            one.node_key("web-1", b"\x01" * 32), two.node_key("web-1", b"\x02" * 32)
        )
        assert keys[0] == keys[1] in (b"\x01" * 32, b"\x02" * 32)
        assert await two.node_key("web-2", b"\x03" * 32) == b"\x03" * 32
        assert await one.node_key("web-1", b"\x04" * 32) == keys[0]
    finally:
        await one.close()
        await two.close()


async def test_the_start_up_lock_admits_one_process_at_a_time(
    pg_schemas: PostgresSchemas,
) -> None:
    one, two = await engines(pg_schemas, 2)
    try:
        async with one.exclusive():
            second = asyncio.ensure_future(_hold(two))
            with pytest.raises(TimeoutError):  # blocked while the first holds it
                await asyncio.wait_for(asyncio.shield(second), 0.3)
        await asyncio.wait_for(second, 10)  # and admitted once it is free
    finally:
        await one.close()
        await two.close()


async def _hold(storage: PostgresStorage) -> None:
    async with storage.exclusive():
        pass


async def test_a_dropped_listen_connection_is_reestablished_and_polled_meanwhile(
    pg_schemas: PostgresSchemas,
) -> None:
    writer, reader = await engines(pg_schemas, 2, poll_interval=0.05)
    try:
        pid = reader.listener_pid
        assert pid is not None
        async with await psycopg.AsyncConnection.connect(pg_schemas.dsn, autocommit=True) as conn:
            await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        for n in range(3):  # seen while the listener is down or back, by poll or by wake
            h = History.make(n=n)
            offset = await reader.last_offset()
            waiting = asyncio.ensure_future(reader.wait_for_feed(offset, timeout=30))
            await writer.write(WriteBatch((h.g,), (state_of([h.g]),)))
            assert await asyncio.wait_for(waiting, 30)
        async with asyncio.timeout(30):  # it listens again, on a new connection
            while reader.listener_pid in (None, pid):
                with contextlib.suppress(TimeoutError):
                    await reader.wait_for_feed(await reader.last_offset(), timeout=0.05)
        assert reader.listener_pid != pid
    finally:
        await writer.close()
        await reader.close()
