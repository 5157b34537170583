"""Serving peers over websockets: ``mycelia.serve(node, host, port)`` (ARCHITECTURE.md §7).

Each accepted websocket becomes a :class:`~mycelia.node.peer.PeerConnection` driven until
it closes. A faulty peer (garbage frames, a wrong version, a forged event, a frame over the
limit) is answered with a typed error or closed; the server keeps serving the others.
Closing the server stops accepting, closes every connection and waits for their
in-flight requests to finish.
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType
from typing import TYPE_CHECKING

from websockets.asyncio.server import Server as WsServer
from websockets.asyncio.server import ServerConnection
from websockets.asyncio.server import serve as ws_serve

from mycelia.node.peer import PeerConnection
from mycelia.node.transport import WebsocketTransport

if TYPE_CHECKING:
    from mycelia.node.node import Node

__all__ = ["Server", "serve"]

log = logging.getLogger(__name__)


class Server:
    """A running websocket server for one node; an async context manager."""

    def __init__(self, node: Node, ws_server: WsServer) -> None:
        self.node = node
        self._ws = ws_server
        self.connections: set[PeerConnection] = set()

    @property
    def port(self) -> int:
        """The port it listens on (useful with ``port=0``)."""
        for sock in self._ws.sockets:
            return int(sock.getsockname()[1])
        raise RuntimeError("the server is not listening")  # pragma: no cover

    @property
    def host(self) -> str:
        """The address it listens on."""
        for sock in self._ws.sockets:
            return str(sock.getsockname()[0])
        raise RuntimeError("the server is not listening")  # pragma: no cover

    async def close(self, *, drain_timeout: float = 10.0) -> None:
        """Stop accepting, let in-flight requests (commits) finish, then close everything."""
        self._ws.close(close_connections=False)
        peers = list(self.connections)
        await asyncio.gather(*(peer.drain(drain_timeout) for peer in peers))
        for peer in peers:
            await peer.close()
        self._ws.close(close_connections=True)
        await self._ws.wait_closed()

    async def serve_forever(self) -> None:
        """Serve until cancelled."""
        await self._ws.serve_forever()

    async def __aenter__(self) -> Server:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


async def serve(
    node: Node,
    host: str = "127.0.0.1",
    port: int = 9797,
    *,
    compression: str | None = None,
    request_timeout: float = 30.0,
    handshake_timeout: float = 10.0,
    outgoing_frames: int = 4096,
) -> Server:
    """Start serving ``node`` on ``host:port`` (``port=0`` picks a free one).

    ``handshake_timeout``: a peer that has not completed the handshake by then is closed.
    ``outgoing_frames``: frames queued for one peer before it counts as too slow and is
    disconnected (it can reconnect and catch up; memory stays bounded).
    """
    server: Server | None = None

    async def handler(websocket: ServerConnection) -> None:
        assert server is not None  # set before the first connection is accepted
        peer = node.accept(
            WebsocketTransport(websocket),
            request_timeout=request_timeout,
            handshake_timeout=handshake_timeout,
            outgoing_frames=outgoing_frames,
        )
        server.connections.add(peer)
        try:
            await peer.run()
        finally:
            server.connections.discard(peer)

    ws_server = await ws_serve(
        handler,
        host,
        port,
        max_size=node.limits.max_frame_bytes,
        compression=compression,
        ping_interval=20,
        close_timeout=2,  # a peer that will not finish the closing handshake is cut off
    )
    server = Server(node, ws_server)
    log.info("serving node %s on ws://%s:%d", node.node_id, server.host, server.port)
    return server
