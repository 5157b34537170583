"""Misuse fails fast, with a message that says what to do (issue 17)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from mycelia import EntityId, Event, Model, Node
from mycelia.errors import (
    InvalidArgument,
    LocalProtocolError,
    NodeClosed,
    SystemNotReady,
    UsageError,
)
from mycelia.node.inprocess import InProcessServer
from mycelia.storage import LmdbStorage, MemoryStorage


class Note(Model, collection="notes"):
    title: str


class Unnamed(Model):
    title: str


async def durable() -> Node:
    node = await Node.open(MemoryStorage(), durable=True)
    await node.create_system()
    return node


async def test_a_live_query_iterated_outside_async_with_raises_instead_of_hanging() -> None:
    node = await durable()
    live = node.context().query(Note, "")
    with pytest.raises(UsageError, match=r"inside 'async with ctx\.query\(\.\.\.\) as live:'"):
        async for _ in live:
            pass
    await node.close()


async def test_a_transaction_dropped_without_commit_warns_like_an_unclosed_file() -> None:
    node = await durable()
    trx = node.context().transaction()
    trx.create(Note, title="lost")
    del trx
    with pytest.warns(ResourceWarning, match="dropped without being committed.*1 entities"):
        gc.collect()
    assert await node.context().fetch(Note, "") == []  # it was never committed
    await node.close()


async def test_a_committed_or_rolled_back_transaction_does_not_warn() -> None:
    node = await durable()
    trx = node.context().transaction()
    trx.create(Note, title="kept")
    await trx.commit()
    other = node.context().transaction()
    await other.rollback()
    del trx, other
    gc.collect()  # filterwarnings=error: a warning here would fail the test
    await node.close()


async def test_a_str_id_is_refused_with_the_way_to_parse_it() -> None:
    node = await durable()
    async with node.context().transaction() as trx:
        note = trx.create(Note, title="x")
    text = str(note.id)
    ctx = node.context()
    hint = rf"EntityId\.from_base64\('{text}'\)"
    with pytest.raises(InvalidArgument, match=hint):
        await ctx.get(Note, text)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=hint):
        await ctx.history(Note, text)  # type: ignore[arg-type]
    async with ctx.transaction() as trx:
        with pytest.raises(InvalidArgument, match=hint):
            await trx.edit(Note, text)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match=hint):
            await trx.delete(Note, text)  # type: ignore[arg-type]
    assert (await ctx.get(Note, EntityId.from_base64(text))).title == "x"
    await node.close()


async def test_a_closed_node_raises_node_closed_on_every_call() -> None:
    node = await durable()
    ctx = node.context()
    async with ctx.transaction() as trx:
        note = trx.create(Note, title="x")
    open_trx = ctx.transaction()
    async with ctx.query(Note, "") as live:
        changes = aiter(live)
        await anext(changes)
        await node.close()
        with pytest.raises(StopAsyncIteration):  # an open live query's iteration ends
            await asyncio.wait_for(anext(changes), 5)
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "get": lambda: ctx.get(Note, note.id),
        "fetch": lambda: ctx.fetch(Note, ""),
        "history": lambda: ctx.history(Note, note.id),
        "commit": open_trx.commit,
        "create_system": node.create_system,
        "system_events": node.system_events,
        "join_system": lambda: node.join_system([]),
        "ingest": lambda: node.ingest([]),
        "wait_ready": node.wait_ready,
    }
    for name, call in calls.items():
        with pytest.raises(NodeClosed, match="this node is closed"):
            await call()
        assert name
    sync_calls: tuple[Callable[[], object], ...] = (
        node.context,
        ctx.transaction,
        lambda: ctx.query(Note, ""),
        node.stats,
        node.owed,
        lambda: open_trx.create(Note, title="y"),
    )
    for sync_call in sync_calls:
        with pytest.raises(NodeClosed):
            sync_call()
    with pytest.raises(NodeClosed):
        async with ctx.transaction():
            pass
    await node.close()  # closing again is fine


async def test_a_client_without_a_system_is_told_to_connect_once() -> None:
    app = await Node.open(MemoryStorage(), durable=False)
    async with app.context().transaction() as trx:
        with pytest.raises(SystemNotReady, match="connect once to a server to join its system"):
            trx.create(Note, title="too early")
    with pytest.raises(LocalProtocolError, match="a client joins its server's system"):
        await app.create_system()
    await app.close()


async def test_an_app_works_offline_from_its_very_first_run_with_shipped_root_events(
    tmp_path: Path,
) -> None:
    """The server's root events, shipped with the app, let a client that has never been
    online join the system and commit; the commits reach the server once it connects."""
    server_node = await durable()
    shipped = [e.event.to_bytes() for e in await server_node.system_events()]  # the app ships
    app = await Node.open(LmdbStorage(tmp_path / "app"), durable=False)  # first run, offline
    await app.join_system([Event.from_bytes(blob) for blob in shipped])
    async with app.context().transaction() as trx:  # no peer: returns once owed
        note = trx.create(Note, title="written offline")
    assert len(app.owed()) == 1
    server = InProcessServer(server_node)
    server.connect(app)
    await app.wait_ready(timeout=10)  # preparing the session pushes what is owed
    assert app.owed() == []
    assert (await server_node.context().get(Note, note.id)).title == "written offline"
    await app.close()
    await server.close()
    await server_node.close()


def test_the_default_collection_is_the_lower_case_class_name() -> None:
    assert Unnamed.__collection__ == "unnamed"
    assert Note.__collection__ == "notes"


def test_the_reserved_collection_prefix_is_named_as_reserved() -> None:
    with pytest.raises(InvalidArgument, match="the collection prefix '_mycelia_' is reserved"):

        class Sneaky(Model, collection="_mycelia_x"):
            title: str
