"""A raw websocket client that sends corpus items to a live node and reports the outcome."""

from __future__ import annotations

import asyncio

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed as WsClosed
from websockets.protocol import State

from mycelia.node.identity import NodeKey
from mycelia.node.session import PeerSession, SessionState
from mycelia.proto import DEFAULT_LIMITS, EntityId
from mycelia.proto.messages import decode_frame
from mycelia.proto.peering import ErrorResponse, Presence, PresenceProof, PresenceRejected
from mycelia.testing.corpus import CorpusItem

TIMEOUT = 10.0


async def handshake(ws: ClientConnection, root: EntityId | None) -> None:
    """Complete the two-frame handshake as an ephemeral client announcing ``root``."""
    session = PeerSession(
        key=NodeKey.generate(), durable=False, system_root=root, limits=DEFAULT_LIMITS
    )
    for frame in session.start():
        await ws.send(frame)
    while session.state is not SessionState.READY:
        session.receive(await ws.recv())  # type: ignore[arg-type]
        for frame in session.take_outgoing():
            await ws.send(frame)


async def outcome(url: str, item: CorpusItem, root: EntityId) -> str:
    """``error:<Kind>``, ``rejected``, ``close``, or what went wrong (``answered:<Type>``,
    ``silent``) when the node neither refused nor closed."""
    ws = await connect(url, max_size=None, compression=None)
    try:
        try:
            if item.phase == "ready":
                announced = EntityId(item.handshake_root) if item.handshake_root else root
                await handshake(ws, announced)
            for frame in item.frames:
                await ws.send(frame)
        except WsClosed:
            pass  # the node may have refused and closed first: its last frames are still queued
        return await _first_verdict(ws)
    finally:
        if ws.state is not State.CLOSED:  # closing a connection the peer cut would fail
            await ws.close()


async def _first_verdict(ws: ClientConnection) -> str:
    rejected = False
    try:
        async with asyncio.timeout(TIMEOUT):
            while True:
                msg = decode_frame(await ws.recv())  # type: ignore[arg-type]
                if isinstance(msg, PresenceRejected):
                    rejected = True
                elif isinstance(msg, Presence | PresenceProof):
                    continue  # the node's own handshake frames, sent before it reads ours
                elif isinstance(msg, ErrorResponse):
                    return f"error:{msg.kind}"
                elif not rejected:
                    return f"answered:{type(msg).__name__}"
    except WsClosed:
        return "rejected" if rejected else "close"
    except TimeoutError:
        return "silent"
