"""Nodes peering over real websockets on 127.0.0.1 (port 0)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

import mycelia
from mycelia import ConnectionState, Model, Node, Server, Text
from mycelia.errors import EntityNotFound, PolicyDenied
from mycelia.node.outbox import OUTBOX_PREFIX
from mycelia.proto import SYSTEM_COLLECTION, Event
from mycelia.proto.peering import Ack, CommitRequest
from mycelia.storage import MemoryStorage
from tests.node.conftest import NodeFactory


class Album(Model, collection="albums"):
    name: Text
    artist: str
    year: int


async def create(node: Node, **values: Any) -> mycelia.EntityId:
    async with node.context().transaction() as trx:
        return trx.create(Album, **values).id


async def test_a_create_on_one_client_is_seen_on_another_via_get_fetch_and_live(
    server: tuple[Node, Server], client: NodeFactory
) -> None:
    a, _ = await client()
    b, _ = await client()
    async with b.context().query(Album, "year > ?", 1980) as live:
        changes = aiter(live)
        assert (await anext(changes)).initial == []
        album = await create(a, name="Parade", artist="Prince", year=1986)
        seen = await asyncio.wait_for(anext(changes), 10)
        assert [v.id for v in seen.added] == [album]
        assert str(seen.added[0].name) == "Parade"
    assert (await b.context().get(Album, album)).artist == "Prince"
    assert [v.id for v in await b.context().fetch(Album, "artist = ?", "Prince")] == [album]
    assert (await server[0].context().get(Album, album)).year == 1986


async def test_edits_flow_both_ways_and_concurrent_edits_converge(
    server: tuple[Node, Server], client: NodeFactory
) -> None:
    a, _ = await client()
    b, _ = await client()
    album = await create(a, name="x", artist="a", year=1)
    await b.context().get(Album, album)
    async with a.context().transaction() as ta, b.context().transaction() as tb:
        (await ta.edit(Album, album)).artist = "from a"
        (await tb.edit(Album, album)).year = 2
        (await tb.edit(Album, album)).name.insert(1, "!")
    views = [await n.context().get(Album, album) for n in (a, b, server[0])]
    assert {(v.artist, v.year, str(v.name), v.head) for v in views} == {
        ("from a", 2, "x!", views[2].head)
    }


async def test_unsubscribing_stops_the_server_pushing(
    server: tuple[Node, Server], client: NodeFactory
) -> None:
    a, _ = await client()
    b, _ = await client()
    async with b.context().query(Album, "year > 0") as live:
        await anext(aiter(live))
        assert server[0].stats().subscriptions == 1
    assert server[0].stats().subscriptions == 0  # closing waited for the server
    before = await b.storage.last_offset()
    await create(a, name="y", artist="b", year=5)
    # Nothing may arrive: prove it by a request that is answered after any push would be.
    await b.context().fetch(Album, "year < 0")
    assert await b.storage.last_offset() == before


async def test_a_resubscribe_after_server_edits_shows_the_latest_values_rt106(
    server: tuple[Node, Server], client: NodeFactory
) -> None:
    a, _ = await client()
    album = await create(server[0], name="x", artist="v1", year=1)
    async with a.context().query(Album, "year > 0") as live:
        assert [v.artist for v in (await anext(aiter(live))).initial] == ["v1"]
    for version in ("v2", "v3"):
        async with server[0].context().transaction() as trx:
            (await trx.edit(Album, album)).artist = version
    async with a.context().query(Album, "year > 0") as live:
        assert [v.artist for v in (await anext(aiter(live))).initial] == ["v3"]
    history = {e.id for e in await server[0].storage.events_of(album)}
    assert {e.id for e in await a.storage.events_of(album)} <= history


async def test_clients_survive_a_server_restart_and_entities_that_stopped_matching_go_rt114(
    client: NodeFactory,
) -> None:
    storage = MemoryStorage()
    node = await Node.open(storage, durable=True)
    await node.create_system()
    running = await mycelia.serve(node, host="127.0.0.1", port=0)
    port = running.port
    a = await Node.open(MemoryStorage(), durable=False)
    connection = await mycelia.connect(a, f"ws://127.0.0.1:{port}")
    await a.wait_ready(timeout=10)
    keep = await create(node, name="k", artist="x", year=2000)
    leave = await create(node, name="l", artist="x", year=2001)
    async with a.context().query(Album, "year >= 2000") as live:
        changes = aiter(live)
        assert {v.id for v in (await anext(changes)).initial} == {keep, leave}
        await running.close()
        await connection.wait_state(ConnectionState.DISCONNECTED, timeout=10)
        async with node.context().transaction() as trx:
            (await trx.edit(Album, leave)).year = 1999  # stops matching while a is away
        running = await mycelia.serve(node, host="127.0.0.1", port=port)
        await connection.wait_ready(timeout=20)
        seen = await asyncio.wait_for(anext(changes), 10)
        assert [v.id for v in seen.removed] == [leave]
        assert [v.id for v in live.items] == [keep]
    await a.close()
    await running.close()
    await node.close()


async def test_commits_made_offline_are_owed_and_pushed_on_reconnect_even_after_a_restart() -> None:
    storage = MemoryStorage()
    node = await Node.open(storage, durable=True)
    await node.create_system()
    running = await mycelia.serve(node, host="127.0.0.1", port=0)
    port = running.port
    client_storage = MemoryStorage()
    a = await Node.open(client_storage, durable=False)
    connection = await mycelia.connect(a, f"ws://127.0.0.1:{port}")
    await a.wait_ready(timeout=10)
    await running.close()
    album = await create(a, name="offline", artist="x", year=1)  # no server: owed
    assert [e.entity_id for e in a.owed()] == [album]
    await connection.close()
    # The app restarts: a new node on the same storage still owes the commit.
    again = await Node.open(client_storage, durable=False)
    assert [e.entity_id for e in again.owed()] == [album]
    running = await mycelia.serve(node, host="127.0.0.1", port=port)
    connection = await mycelia.connect(again, f"ws://127.0.0.1:{port}")
    await again.wait_ready(timeout=20)
    assert (await node.context().get(Album, album)).name == "offline"
    assert again.owed() == []
    await connection.close()  # settles the confirmed commit's record before it returns
    assert await client_storage.scan_meta(OUTBOX_PREFIX) == []
    await running.close()


async def test_get_of_an_unknown_entity_raises_entity_not_found(
    server: tuple[Node, Server], client: NodeFactory
) -> None:
    a, _ = await client()
    with pytest.raises(EntityNotFound):
        await a.context().get(Album, mycelia.EntityId(b"\x09" * 32))


async def test_reserved_collections_refuse_client_commits(
    server: tuple[Node, Server], client: NodeFactory
) -> None:
    _, connection = await client()
    assert server[0].system_root is not None
    sneaky = Event.genesis(
        collection=SYSTEM_COLLECTION, system=server[0].system_root, nonce=bytes(16)
    )
    with pytest.raises(mycelia.errors.RemoteError) as info:
        await connection.request(lambda rid: CommitRequest(rid, (sneaky,)), expect=Ack)
    assert info.value.kind == PolicyDenied.__name__
    assert await server[0].storage.events_of(sneaky.entity_id) == []


async def test_a_snapshot_over_older_history_fetches_what_it_needs_and_keeps_an_antichain(
    server: tuple[Node, Server], client: NodeFactory
) -> None:
    server_node, _ = server
    a, _ = await client()
    album = await create(server_node, name="g", artist="x", year=1)
    await a.context().get(Album, album)  # a holds the genesis state
    genesis = (await server_node.storage.events_of(album))[:1]
    await a.ingest(genesis)  # ... and the genesis event itself
    for year in (2, 3):
        async with server_node.context().transaction() as trx:
            (await trx.edit(Album, album)).year = year
    view = await a.context().get(Album, album)  # a snapshot: merged over the held genesis
    assert view.year == 3
    assert view.head == (await server_node.context().get(Album, album)).head
    assert len(view.head) == 1  # the genesis is not kept beside its descendant


async def test_a_snapshot_holder_places_a_concurrent_event_once_it_has_the_history() -> None:
    a = await Node.open(MemoryStorage(), durable=True)
    await a.create_system()
    album = await create(a, name="g", artist="x", year=1)
    async with a.context().transaction() as trx:
        (await trx.edit(Album, album)).year = 2  # A
    fork = await Node.open(MemoryStorage(), durable=True)
    await fork.join_system(await a.system_events())
    await fork.ingest(await a.storage.events_of(album))
    async with a.context().transaction() as trx:
        (await trx.edit(Album, album)).year = 3  # B on A
    async with fork.context().transaction() as trx:
        (await trx.edit(Album, album)).artist = "y"  # C on A, concurrent with B
    e = await Node.open(MemoryStorage(), durable=False)
    await e.join_system(await a.system_events())
    state = await a.storage.get_state(album)
    assert state is not None
    await e.ingest_states([state])  # holds [B] without its events
    await e.ingest([(await fork.storage.events_of(album))[-1]])  # C: held, A is unknown
    await e.ingest(await a.storage.events_of(album))  # the history arrives: C applies
    view = await e.context().get(Album, album)
    assert (view.year, view.artist) == (3, "y")


async def test_a_client_catching_up_takes_the_snapshot_on_its_servers_word(
    server: tuple[Node, Server], client: NodeFactory
) -> None:
    server_node, _ = server
    a, _ = await client()
    album = await create(server_node, name="g", artist="x", year=0)
    await a.context().get(Album, album)  # a holds the genesis state, without events
    for year in range(1, 41):
        async with server_node.context().transaction() as trx:
            (await trx.edit(Album, album)).year = year
    view = await a.context().get(Album, album)  # a snapshot (smaller than 40 events) ...
    assert view.year == 40
    assert view.head == (await server_node.context().get(Album, album)).head
    # ... that the server said descends from a's head: a walked no history to merge it.
    assert await a.storage.events_of(album) == []


async def test_a_durable_client_takes_no_head_on_the_servers_word(
    server: tuple[Node, Server],
) -> None:
    server_node, running = server
    album = await create(server_node, name="g", artist="x", year=0)
    durable = await Node.open(MemoryStorage(), durable=True)
    await mycelia.connect(durable, f"ws://127.0.0.1:{running.port}")
    await durable.wait_ready(timeout=10)
    try:
        async with server_node.context().transaction() as trx:
            (await trx.edit(Album, album)).year = 1
        first = await durable.context().get(Album, album)  # held without its events
        for year in range(2, 42):
            async with server_node.context().transaction() as trx:
                (await trx.edit(Album, album)).year = year
        view = await durable.context().get(Album, album)
        assert view.year == 41
        # The snapshot's base is ignored: without the history here to compare, the
        # durable node keeps both heads (the usual fallback) instead of trusting the peer.
        # (Only a genesis is dropped beside other ids: it is the root of every history.)
        assert set(view.head) == set(first.head) | set(
            (await server_node.context().get(Album, album)).head
        )
    finally:
        await durable.close()


async def test_the_server_sends_each_frame_at_once(
    server: tuple[Node, Server], client: NodeFactory
) -> None:
    """No Nagle delay on served connections: with it, an answer queued behind a pushed
    update waited for the client's delayed ACK (40 ms a commit with a live query open)."""
    await client()
    (connection,) = server[1]._ws.connections  # type: ignore[union-attr]  # the one client
    sock = connection.transport.get_extra_info("socket")
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
