"""Hostile peers get a typed error or a close; nothing is persisted; the server keeps serving."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed as WsClosed

import mycelia
from mycelia import Model, Node, Server
from mycelia.errors import RequestTimeout
from mycelia.node.budget import Bounds
from mycelia.node.identity import NodeKey
from mycelia.node.session import PeerSession
from mycelia.node.transport import memory_pair
from mycelia.proto import DEFAULT_LIMITS, Clock, EntityId, Event, EventId
from mycelia.proto.messages import PROTOCOL_VERSION, Message, decode_frame, encode_frame
from mycelia.proto.peering import (
    Ack,
    CommitRequest,
    DeltasResponse,
    ErrorResponse,
    GetRequest,
    PresenceProof,
    PresenceRejected,
    SubscribeRequest,
)
from mycelia.storage import MemoryStorage


class Note(Model, collection="notes"):
    text: str


@pytest.fixture
async def served() -> AsyncIterator[tuple[Node, Server]]:
    node = await Node.open(MemoryStorage(), durable=True)
    await node.create_system()
    server = await mycelia.serve(node, host="127.0.0.1", port=0, handshake_timeout=0.5)
    yield node, server
    await server.close()
    await node.close()


async def raw(server: Server) -> ClientConnection:
    return await connect(f"ws://127.0.0.1:{server.port}", max_size=None, compression=None)


async def handshake(
    ws: ClientConnection, node: Node, *, version: int = PROTOCOL_VERSION
) -> PeerSession:
    session = PeerSession(
        key=NodeKey.generate(),
        durable=False,
        system_root=node.system_root,
        limits=DEFAULT_LIMITS,
        version=version,
    )
    for frame in session.start():
        await ws.send(frame)
    while session.state.value != "ready":
        session.receive(await ws.recv())  # type: ignore[arg-type]
        for frame in session.take_outgoing():
            await ws.send(frame)
    return session


async def closed(ws: ClientConnection) -> list[Message]:
    """Everything the server sent until it closed the connection."""
    frames: list[Message] = []

    async def drain() -> None:
        async with asyncio.timeout(10):
            while True:
                frames.append(decode_frame(await ws.recv()))  # type: ignore[arg-type]

    with pytest.raises(WsClosed):
        await drain()
    return frames


async def still_serving(node: Node, server: Server) -> None:
    client = await Node.open(MemoryStorage(), durable=False)
    await mycelia.connect(client, f"ws://127.0.0.1:{server.port}")
    await client.wait_ready(timeout=10)
    async with client.context().transaction() as trx:
        note = trx.create(Note, text="fine")
    assert (await node.context().get(Note, note.id)).text == "fine"
    await client.close()


@pytest.mark.parametrize(
    "frame",
    [b"garbage", b"\x95\xb1mycelia", encode_frame(Ack(1)), b"\xdd\xff\xff\xff\xff"],
    ids=["garbage", "truncated", "wrong type first", "huge array header"],
)
async def test_bad_first_frames_close_the_connection(
    served: tuple[Node, Server], frame: bytes
) -> None:
    node, server = served
    ws = await raw(server)
    await ws.send(frame)
    await closed(ws)
    await still_serving(node, server)


async def test_a_frame_over_the_limit_closes_the_connection(served: tuple[Node, Server]) -> None:
    node, server = served
    ws = await raw(server)
    await handshake(ws, node)
    await ws.send(b"\x00" * (10 * 1024 * 1024))
    await closed(ws)
    await still_serving(node, server)


async def test_a_wrong_protocol_version_is_rejected_then_closed(
    served: tuple[Node, Server],
) -> None:
    node, server = served
    ws = await raw(server)
    session = PeerSession(
        key=NodeKey.generate(), durable=False, system_root=None, limits=DEFAULT_LIMITS, version=9
    )
    await ws.send(session.start()[0])
    frames = await closed(ws)
    rejected = [f for f in frames if isinstance(f, PresenceRejected)]
    assert rejected
    assert rejected[0].expected_version == PROTOCOL_VERSION
    await still_serving(node, server)


async def test_a_proof_with_the_wrong_key_is_rejected(served: tuple[Node, Server]) -> None:
    node, server = served
    ws = await raw(server)
    session = PeerSession(
        key=NodeKey.generate(), durable=False, system_root=None, limits=DEFAULT_LIMITS
    )
    await ws.send(session.start()[0])
    session.receive(await ws.recv())  # type: ignore[arg-type]
    session.take_outgoing()
    await ws.send(encode_frame(PresenceProof(NodeKey.generate().sign(b"x"), None)))
    frames = await closed(ws)
    assert any(isinstance(f, PresenceRejected) for f in frames)
    await still_serving(node, server)


async def test_a_silent_peer_is_closed_after_the_handshake_timeout(
    served: tuple[Node, Server],
) -> None:
    node, server = served
    ws = await raw(server)
    await closed(ws)  # sends nothing: the server gives up after 0.5 s
    await still_serving(node, server)


async def _commit(ws: ClientConnection, session: PeerSession, *events: Event) -> object:
    rid = session.next_request_id()
    await ws.send(encode_frame(CommitRequest(rid, events)))
    return decode_frame(await ws.recv())  # type: ignore[arg-type]


async def test_forged_and_foreign_parent_events_are_refused_and_nothing_persists(
    served: tuple[Node, Server],
) -> None:
    node, server = served
    async with node.context().transaction() as trx:
        mine = trx.create(Note, text="a")
        other = trx.create(Note, text="b")
    ws = await raw(server)
    session = await handshake(ws, node)
    dangling = Event.update(
        entity_id=mine.id,
        collection="notes",
        parent=Clock([EventId(b"\x07" * 32)]),
        operations={"lww": [b"\x90"]},
    )
    foreign = Event.update(
        entity_id=mine.id,
        collection="notes",
        parent=Clock([EventId(bytes(other.id))]),
        operations={"lww": [b"\x90"]},
    )
    wrong_system = Event.genesis(collection="notes", system=EntityId(b"\x05" * 32), nonce=bytes(16))
    for forged, kind in [
        (dangling, "EventNotFound"),
        (foreign, "InvalidEvent"),
        (wrong_system, "ForeignSystem"),
    ]:
        answer = await _commit(ws, session, forged)
        assert isinstance(answer, ErrorResponse)
        assert answer.kind == kind
        assert await node.storage.get_events([forged.id]) == {}
    offset = await node.storage.last_offset()
    # A remote commit is all-or-nothing: one bad event refuses the good one with it.
    good = Event.update(
        entity_id=mine.id,
        collection="notes",
        parent=(await node.context().get(Note, mine.id)).head,
        operations={},
    )
    answer = await _commit(ws, session, good, dangling)
    assert isinstance(answer, ErrorResponse)
    assert await node.storage.last_offset() == offset
    await ws.close()
    await still_serving(node, server)


async def test_a_request_to_a_peer_that_never_answers_times_out() -> None:
    node = await Node.open(MemoryStorage(), durable=False)
    near, far = memory_pair()
    peer = node.accept(near, request_timeout=0.2, handshake_timeout=10, outgoing_frames=16)
    runner = asyncio.ensure_future(peer.run())
    mute = PeerSession(
        key=NodeKey.generate(), durable=True, system_root=None, limits=DEFAULT_LIMITS
    )
    for frame in mute.start():
        await far.send(frame)
    while mute.state.value != "ready":
        mute.receive(await far.recv())
        for frame in mute.take_outgoing():
            await far.send(frame)
    await peer.wait_ready()
    with pytest.raises(RequestTimeout):
        await peer.request(lambda rid: GetRequest(rid, ()), expect=DeltasResponse)
    await peer.close()
    await runner
    await node.close()


async def test_a_subscriber_that_stops_reading_is_disconnected_and_can_catch_up() -> None:
    node = await Node.open(MemoryStorage(), durable=True)
    await node.create_system()
    # A push carries what was queued behind the one before (several commits in one
    # frame), so it is the bytes that overflow, well past what the sockets buffer.
    bounds = Bounds(outgoing_bytes=1024 * 1024)
    server = await mycelia.serve(node, host="127.0.0.1", port=0, outgoing_frames=16, bounds=bounds)
    ws = await connect(
        f"ws://127.0.0.1:{server.port}", max_size=None, compression=None, max_queue=1
    )
    session = await handshake(ws, node)
    await ws.send(encode_frame(SubscribeRequest(session.next_request_id(), 1, "notes", "", (), ())))
    await ws.recv()  # the (empty) initial answer; from now on it never reads again
    connection = next(iter(server.connections))
    for i in range(8000):
        async with node.context().transaction() as trx:
            trx.create(Note, text="x" * 8000 + str(i))
        if connection.error is not None:
            break
    await asyncio.wait_for(connection.wait_closed(), 10)
    assert "slow consumer" in str(connection.error)
    # A well-behaved client reconnecting gets everything.
    reader = await Node.open(MemoryStorage(), durable=False)
    await mycelia.connect(reader, f"ws://127.0.0.1:{server.port}")
    await reader.wait_ready(timeout=10)
    assert len(await reader.context().fetch(Note, "")) == len(await node.context().fetch(Note, ""))
    await reader.close()
    await ws.close()
    await server.close()
    await node.close()
