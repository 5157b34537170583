"""Bounds counted in bytes, connection limits and answers lost mid-way (issue 16, defects
1 and 6), in-process: the budgets are small here so each test is short. The same attacks
against a real ``mycelia serve`` at full size are ``tests/hostile/test_memory.py``."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import random
import time
from pathlib import Path

import pytest

import mycelia
from mycelia import Model, Node, Server
from mycelia.entity import Entity, Residents
from mycelia.entity.residents import resident_size
from mycelia.errors import ConnectionClosed, Overloaded
from mycelia.node.budget import Bounds, InFlight, Outgoing, Pool
from mycelia.node.connections import BoundedConnection, Partial
from mycelia.node.link import ConnectionState
from mycelia.node.peer import PeerConnection
from mycelia.node.serving import Responder
from mycelia.node.transport import Transport, memory_pair
from mycelia.proto.messages import Message, decode_frame, peek
from mycelia.proto.peering import DeltasPage, DeltasResponse, GetRequest, SubscribeRequest
from mycelia.storage import LmdbStorage, MemoryStorage
from mycelia.storage.recent import RECENT_BYTES
from tests.hostile.serving import RawPeer

KIB, MIB = 1024, 1024 * 1024


class Blob(Model, collection="blobs"):
    data: bytes
    n: int = 0


# -- the budgets themselves ------------------------------------------------------------------


async def test_a_pool_hands_out_bytes_in_turn_and_lets_one_oversized_taker_through() -> None:
    pool = Pool(100)
    assert pool.try_take(60)
    order: list[str] = []

    async def take(name: str, size: int) -> None:
        await pool.take(size)
        order.append(name)

    first = asyncio.ensure_future(take("first", 50))
    second = asyncio.ensure_future(take("second", 10))  # would fit, but waits its turn
    await asyncio.sleep(0)
    assert order == []
    pool.give(60)
    await asyncio.gather(first, second)
    assert order == ["first", "second"]
    pool.give(60)
    assert pool.used == 0
    assert pool.try_take(500)  # larger than the whole pool, but nothing else is held


async def test_a_taker_cancelled_as_the_pool_passes_it_over_leaves_cleanly() -> None:
    # Seen under W3 load: a cancelled waiter was dropped from the queue by a give() that
    # ran before the waiter's own clean-up, which then raised ValueError.
    pool = Pool(100)
    assert pool.try_take(100)
    waiter = asyncio.ensure_future(pool.take(50))
    await asyncio.sleep(0)
    waiter.cancel()
    pool.give(100)  # passes the cancelled turn over before the waiter wakes
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert pool.used == 0
    assert pool.try_take(100)


async def test_an_outgoing_queue_counts_bytes_until_written() -> None:
    out = Outgoing(100, Pool(1000), max_frames=10)
    assert out.offer(b"x" * 60)
    assert not out.offer(b"y" * 60)  # over the budget: the caller cuts the peer off
    put = asyncio.ensure_future(out.put(50, lambda: b"z" * 50))
    await asyncio.sleep(0)
    assert not put.done()  # waits for room before even encoding
    item = await out.get()
    assert item is not None
    out.written(item)
    await put
    assert out.queued_bytes == 50
    out.close(drop=True)
    assert out.queued_bytes == 0
    assert await out.get() is None


async def test_room_reserved_for_answers_does_not_make_a_push_overflow() -> None:
    # The W3 cascade: a client's answers, each holding its page's room while it waits on
    # storage, filled the budget, and the next pushed update cut off a client that had
    # been sent nothing it could be slow to read.
    out = Outgoing(100, Pool(1000))
    await out.reserve(60)
    await out.reserve(40)  # the whole budget reserved, nothing queued
    waiting = asyncio.ensure_future(out.put(50, lambda: b"a" * 50))  # an answer in line
    await asyncio.sleep(0)
    assert out.offer(b"x" * 70)  # a push still fits among the frames
    assert out.offer(b"y" * 30)
    assert not out.offer(b"z")  # frames over the budget: a slow consumer after all
    assert out.queued_bytes == 200  # at most twice the budget: frames and reservations
    out.unreserve(100)
    for _ in range(2):
        item = await out.get()
        assert item is not None
        out.written(item)
    await waiting  # the answer waited behind the pushes, then got its room
    assert out.queued_bytes == 50
    assert out.offer(b"w" * 50)


async def test_waiting_for_the_node_s_pool_alone_does_not_make_a_peer_stuck() -> None:
    pool = Pool(100)
    busy, idle = Outgoing(1000, pool), Outgoing(1000, pool)
    await busy.put(100, lambda: b"x" * 100)  # the whole pool, in a frame not yet written
    waiting = asyncio.ensure_future(idle.put(50, lambda: b"y" * 50))
    await asyncio.sleep(0)
    assert not waiting.done()
    assert not idle.stuck(idle.written_frames)  # nothing queued for it: not its fault
    assert busy.stuck(busy.written_frames)  # a frame waits and none was written
    item = await busy.get()
    assert item is not None
    assert busy.stuck(busy.written_frames)  # being written counts as waiting
    busy.written(item)
    await waiting
    assert (pool.used, idle.queued_bytes, busy.queued_bytes) == (50, 50, 0)


async def test_a_sender_woken_by_the_close_takes_nothing_from_the_node_s_pool() -> None:
    # Found by the test below: a cut-off peer's waiting senders woke and briefly took up
    # to the whole node-wide pool before they saw the close.
    pool = Pool(1000)
    out = Outgoing(100, pool)
    await out.reserve(100)
    waiting = asyncio.ensure_future(out.reserve(100))
    await asyncio.sleep(0)
    out.close(drop=True)
    with pytest.raises(ConnectionClosed):
        await waiting
    assert pool.used == 100, "only the reservation made before the close"
    out.unreserve(100)
    assert (pool.used, out.queued_bytes) == (0, 0)


async def test_room_reserved_ahead_is_taken_over_by_the_frame_or_left_to_its_owner() -> None:
    pool = Pool(1000)
    out = Outgoing(1000, pool)
    await out.reserve(300)
    slot = [300]
    await out.put(120, lambda: b"z" * 120, slot=slot)  # the excess goes back at once
    assert (slot, out.queued_bytes, pool.used) == ([0], 120, 120)
    await out.reserve(300)
    slot = [300]
    cancelled = asyncio.ensure_future(out.put(2000, lambda: b"w" * 2000, slot=slot))
    await asyncio.sleep(0)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert slot == [300]  # still its owner's to give back
    out.unreserve(slot[0])
    assert (out.queued_bytes, pool.used) == (120, 120)


async def test_requests_in_flight_pause_the_reader_by_count_and_by_bytes() -> None:
    flight = InFlight(count=2, size=100)
    flight.add(80)
    await asyncio.wait_for(flight.wait_room(), 1)
    flight.add(30)  # 110 bytes: over
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(flight.wait_room(), 0.05)
    flight.done(80)
    await asyncio.wait_for(flight.wait_room(), 1)


async def test_resident_entities_are_kept_within_their_bytes(node: Node) -> None:
    """Defect 6: the caches held 1,024 entities whatever their size."""
    ids = await blobs(node, 20, 900 * KIB)
    residents = Residents(keep=1000, keep_bytes=8 * MIB)
    held = []  # alive here: still resident (weakly), just not all kept strongly
    for entity_id in ids:
        stored = await node.storage.get_state(entity_id)
        assert stored is not None
        held.append(residents.put(Entity.from_state(stored)))
    assert resident_size(held[0]) > 900 * KIB
    assert residents.kept_bytes <= 8 * MIB
    assert len(residents) == 20


async def test_many_large_commits_keep_lmdb_s_recent_events_within_their_bytes(
    tmp_path: Path,
) -> None:
    node = await Node.open(LmdbStorage(tmp_path / "data"), durable=True)
    await node.create_system()
    for _ in range(40):
        async with node.context().transaction() as trx:
            trx.create(Blob, data=os.urandom(900 * KIB))
    storage = node.storage
    assert isinstance(storage, LmdbStorage)
    assert 0 < storage.cached_event_bytes <= RECENT_BYTES
    await node.close()


# -- a served node -------------------------------------------------------------------------


async def blobs(node: Node, count: int, size: int) -> list[mycelia.EntityId]:
    ids = []
    for _ in range(count):
        async with node.context().transaction() as trx:
            ids.append(trx.create(Blob, data=os.urandom(size)).id)
    return ids


def served_connection(server: Server) -> PeerConnection:
    """The one connection ``server`` holds. Nothing to wait for once a peer's handshake is
    done: the server holds a connection from before its handshake starts (``serve_peer``)."""
    (connection,) = server.connections
    return connection


async def test_a_subscriber_that_does_not_read_is_cut_off_by_bytes(node: Node) -> None:
    server = await mycelia.serve(node, port=0, bounds=Bounds(outgoing_bytes=1 * MIB))
    slow = await RawPeer.open(server.url, max_queue=1)
    await slow.send(SubscribeRequest(slow.rid(), 1, "blobs", "", (), ()))
    await slow.recv()
    connection = served_connection(server)
    commits = 0
    while connection.error is None and commits < 2000:
        await blobs(node, 1, 64 * KIB)
        commits += 1
    assert isinstance(connection.error, Overloaded)
    assert "slow consumer" in str(connection.error)
    assert commits < 200  # cut off at about 1 MiB queued, not 4,096 frames
    await server.close()


PROBE_EVERY = 0.05
"""Seconds between two reads through another client while a greedy peer waits to be cut
off: the reads sample how the server serves the others meanwhile."""


async def test_unread_answers_wait_for_room_then_the_peer_is_cut_off(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    (entity,) = await blobs(node, 1, 900 * KIB)
    bounds = Bounds(outgoing_bytes=2 * MIB, stall_timeout=0.5)
    server = await mycelia.serve(node, port=0, bounds=bounds)
    greedy = await RawPeer.open(server.url, max_queue=1)
    for _ in range(300):
        await greedy.send(GetRequest(greedy.rid(), (entity,)))
    connection = served_connection(server)
    cut = cut_off_event(connection, monkeypatch)
    reader = await Node.open(MemoryStorage(), durable=False)
    await mycelia.connect(reader, server.url)
    await reader.wait_ready(timeout=10)
    async with asyncio.timeout(20):
        while connection.error is None:
            started = time.monotonic()
            assert (await reader.context().get(Blob, entity)).id == entity
            assert time.monotonic() - started < 0.5  # the others are served meanwhile
            assert node_pool_used(connection) <= 2 * MIB + 2 * MIB
            with contextlib.suppress(TimeoutError):  # the next read, unless cut off first
                await asyncio.wait_for(cut.wait(), PROBE_EVERY)
    assert isinstance(connection.error, Overloaded)
    await greedy.closed()
    await reader.close()
    await server.close()


async def test_an_answer_cancelled_as_a_close_ends_its_wait_leaves_nothing_unretrieved(
    node: Node,
) -> None:
    """The close wakes a wait for room (it ends with ConnectionClosed) in the step the
    answer waiting on it is cancelled (the connection shuts down): that exception was
    never retrieved, and the loop logged it once per answer (hundreds in a soak)."""
    unretrieved: list[str] = []
    asyncio.get_running_loop().set_exception_handler(
        lambda loop, context: unretrieved.append(context["message"])
    )
    near, far = memory_pair()
    connection = node.accept(far, request_timeout=10, handshake_timeout=10, outgoing_frames=4096)
    started, closed = asyncio.Event(), asyncio.Event()

    async def room() -> None:
        started.set()
        await closed.wait()
        raise ConnectionClosed("the connection closed")

    answer = asyncio.ensure_future(connection._wait_room(room()))
    await started.wait()
    closed.set()  # the close wakes the wait for room...
    answer.cancel()  # ...in the step its answer is cancelled
    with pytest.raises(asyncio.CancelledError):
        await answer
    del answer  # its cancellation's traceback holds the wait's frame, and so its task
    await asyncio.sleep(0)  # one turn: the done-callbacks scheduled with it let go of it
    gc.collect()  # a task whose exception nobody retrieved is reported when collected
    assert unretrieved == []
    await near.close()


async def test_a_subscription_answered_as_its_connection_closes_keeps_nothing_of_it(
    node: Node,
) -> None:
    """An answer that finished while its connection was closing registered the standing
    query and a feed task for it after the responder had forgotten the peer: the feed
    (and the connection) stayed referenced for good, its task never ran again (seen in
    the six-client soak as a task destroyed while pending)."""
    near, far = memory_pair()
    connection = node.accept(far, request_timeout=10, handshake_timeout=10, outgoing_frames=4096)
    running = asyncio.ensure_future(connection.run())
    await near.close()  # the peer leaves before its handshake: the connection closes
    await running
    assert connection.closed
    responder = connection._answers
    assert isinstance(responder, Responder)
    with pytest.raises(ConnectionClosed):
        await responder.handle(connection, SubscribeRequest(1, 1, "blobs", "", (), ()))
    assert connection not in responder._queues
    ran: list[bool] = []

    async def work() -> None:
        ran.append(True)

    connection.spawn(work())  # closed unrun, not a task that outlives the connection
    assert not connection._tasks
    assert ran == []


async def test_a_connection_cancelled_while_it_flushes_at_close_still_lets_go_of_all(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled while its shutdown waited for the writer (a server stopping as a peer
    leaves), a connection skipped the rest: its tasks ran on and the responder kept its
    feed (seen in the five-node soak as a feed task destroyed while pending)."""
    near, far = memory_pair()
    connection = node.accept(far, request_timeout=10, handshake_timeout=10, outgoing_frames=4096)
    flushing = asyncio.Event()

    async def stuck_writer() -> None:  # the last frames never go out
        await connection._closed.wait()
        flushing.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(connection, "_write_loop", stuck_writer)

    async def owned() -> None:  # a task of the connection's that would run on
        await asyncio.Event().wait()

    connection.spawn(owned())
    (task,) = connection._tasks
    running = asyncio.ensure_future(connection.run())
    await near.close()  # the peer leaves: the connection shuts down, and waits to flush
    await flushing.wait()
    running.cancel()  # ...when the server stops
    with pytest.raises(asyncio.CancelledError):
        await running
    assert task.cancelled() or task.cancelling()
    responder = connection._answers
    assert isinstance(responder, Responder)
    assert connection not in responder._queues


def node_pool_used(connection: PeerConnection) -> int:
    return connection._me.answers.used


def cut_off_event(connection: PeerConnection, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """An event set once ``connection`` cuts its peer off (it has no event of its own for
    it: its ``cut_off`` is wrapped to set this one too)."""
    cut = asyncio.Event()
    cut_off = connection.cut_off

    def noted(why: str) -> None:
        cut_off(why)
        cut.set()

    monkeypatch.setattr(connection, "cut_off", noted)
    return cut


async def test_half_sent_frames_are_bounded_together_and_cut_off_in_time(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await mycelia.serve(node, port=0, partial_bytes=4 * MIB, unfinished_timeout=1.0)
    totals = every_total(server.partial, monkeypatch)
    peers = [await RawPeer.open(server.url) for _ in range(10)]
    header = b"\x82\xff" + (2 * MIB).to_bytes(8, "big") + b"\0\0\0\0"  # masked, key 0
    for peer in peers:
        peer.ws.transport.write(header + bytes(MIB))  # half of a 2 MiB frame
    for peer in peers:
        code, reason = await peer.closed(timeout=10)
        assert code in (1008, None), reason
    # The rest wait in their sockets (each may hold one read, 256 KiB, past the budget):
    # the bound holds at every moment until they are cut off, not at one chosen instant.
    assert 0 < max(totals, default=0) <= 4 * MIB + 10 * 256 * KIB
    assert server.partial.total == 0
    await server.close()


def every_total(partial: Partial, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The bytes ``partial`` holds after each change, from now on (the server has no
    event for it: its one method that changes the total is wrapped to note each one)."""
    totals: list[int] = []
    update = partial.update

    def noted(connection: BoundedConnection, held: int) -> None:
        update(connection, held)
        totals.append(partial.total)

    monkeypatch.setattr(partial, "update", noted)
    return totals


async def test_connections_beyond_the_limit_are_refused_with_overloaded(node: Node) -> None:
    server = await mycelia.serve(node, port=0, max_connections=3)
    held = [await RawPeer.open(server.url) for _ in range(3)]
    extra = await RawPeer.open(server.url, handshake=False)
    code, reason = await extra.closed()
    assert code == 1013
    assert reason.startswith("11006 Overloaded")
    client = await Node.open(MemoryStorage(), durable=False)
    connection = await mycelia.connect(client, server.url)
    await connection.wait_state(ConnectionState.DISCONNECTED, timeout=10)  # refused at once
    assert isinstance(connection.error, Overloaded)
    assert isinstance(connection.error, ConnectionClosed)
    await held[0].close()
    await client.wait_ready(timeout=10)  # room again: it gets in
    await client.close()
    for peer in held[1:]:
        await peer.close()
    await server.close()


async def test_connections_from_one_address_are_limited(node: Node) -> None:
    server = await mycelia.serve(node, port=0, max_connections_per_ip=2)
    held = [await RawPeer.open(server.url) for _ in range(2)]
    extra = await RawPeer.open(server.url, handshake=False)
    code, reason = await extra.closed()
    assert (code, reason.split(":")[0]) == (1013, "11006 Overloaded")
    for peer in held:
        await peer.close()
    await server.close()


# -- an answer lost mid-way ------------------------------------------------------------------


class Cut:
    """A server-side transport that closes the connection instead of sending the first
    frame of a kind (once): an answer lost mid-way."""

    def __init__(self, inner: Transport, tag: int, armed: list[bool]) -> None:
        self._inner = inner
        self._tag = tag
        self._armed = armed

    @property
    def remote(self) -> str:
        return self._inner.remote

    async def send(self, frame: bytes) -> None:
        if self._armed[0] and peek(frame)[0] == self._tag:
            self._armed[0] = False
            await self._inner.close()
            raise ConnectionClosed("cut")
        await self._inner.send(frame)

    async def recv(self) -> bytes:
        return await self._inner.recv()

    async def close(self) -> None:
        await self._inner.close()


@pytest.mark.parametrize("tag", [DeltasPage.TAG, DeltasResponse.TAG], ids=["page", "last"])
async def test_a_client_that_loses_the_connection_mid_answer_raises(node: Node, tag: int) -> None:
    """Defect 1: a closed connection was taken for "offline", so ``fetch`` returned no
    rows and ``get`` said EntityNotFound, with the answer lost on the way."""
    ids = await blobs(node, 3, 900 * KIB)
    armed = [False]
    tasks = []

    async def dial() -> Transport:
        near, far = memory_pair()
        peer = node.accept(
            Cut(far, tag, armed), request_timeout=10, handshake_timeout=10, outgoing_frames=4096
        )
        tasks.append(asyncio.ensure_future(peer.run()))
        return near

    client = await Node.open(MemoryStorage(), durable=False)
    connection = client.attach(
        dial,
        token=None,
        min_backoff=0.4,
        max_backoff=0.5,
        request_timeout=10,
        rng=random.Random(1),
    )
    connection.start()
    await client.wait_ready(timeout=10)
    armed[0] = True
    with pytest.raises(ConnectionClosed):
        await (
            client.context().fetch(Blob, "")
            if tag == DeltasPage.TAG
            else client.context().get(Blob, ids[0])
        )
    await connection.wait_state(ConnectionState.CONNECTING, timeout=10)
    await client.wait_ready(timeout=10)  # it redialed; the next answer arrives whole
    assert len(await client.context().fetch(Blob, "")) == 3
    await client.close()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_pages_reach_a_real_client_whole(node: Node) -> None:
    ids = await blobs(node, 6, 900 * KIB)
    server = await mycelia.serve(node, port=0)
    client = await Node.open(MemoryStorage(), durable=False)
    await mycelia.connect(client, server.url)
    await client.wait_ready(timeout=10)
    assert sorted(v.id for v in await client.context().fetch(Blob, "")) == sorted(ids)
    peer = await RawPeer.open(server.url)
    rid = peer.rid()
    await peer.send(GetRequest(rid, tuple(ids)))
    frames: list[Message] = []
    async with asyncio.timeout(10):
        while not isinstance(frames[-1] if frames else None, DeltasResponse):
            frames.append(decode_frame(await peer.ws.recv()))  # type: ignore[arg-type]
    assert [type(f) for f in frames[:-1]] == [DeltasPage] * (len(frames) - 1)
    assert len(frames) >= 5  # about a page per 900 KiB entity
    await client.close()
    await peer.close()
    await server.close()
