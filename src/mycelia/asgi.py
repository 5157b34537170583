"""Serve Mycelia from an ASGI application: ``mycelia.asgi.sync_endpoint(node)``.

The endpoint speaks exactly the protocol ``mycelia serve`` speaks (ARCHITECTURE.md §7),
over the ASGI server's websocket (uvicorn, hypercorn...), so a Starlette or FastAPI app
serves Mycelia beside its own routes::

    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    import mycelia.asgi

    endpoint = mycelia.asgi.sync_endpoint(lambda: app.state.node)  # the node, or a getter
    app = Starlette(routes=[WebSocketRoute("/sync", endpoint)], lifespan=...)

Invariants:

- Each websocket is driven by :func:`mycelia.node.server.serve_peer`, the handler body
  the websockets server runs too: same handshake, policy, limits and logs.
- :class:`AsgiTransport` carries binary frames only (a text frame is a protocol error)
  and enforces the node's frame limit itself (an ASGI server's own limit may be larger):
  a frame over it closes the connection with 1009.
- The endpoint imports nothing from an ASGI framework: it is a plain ASGI callable; the
  ``asgi`` extra (``pip install mycelia[asgi]``) only brings uvicorn and Starlette.
- A plain HTTP request to it gets 426 Upgrade Required. :meth:`SyncEndpoint.close`
  drains and closes its connections (call it from the app's shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any, Final

from mycelia.errors import ConnectionClosed, PayloadTooLarge, RemoteProtocolError
from mycelia.node.metrics import Metrics
from mycelia.node.peer import HANDSHAKE_TIMEOUT, OUTGOING_FRAMES
from mycelia.node.server import serve_peer

if TYPE_CHECKING:
    from mycelia.node.node import Node
    from mycelia.node.peer import PeerConnection

__all__ = ["AsgiTransport", "SyncEndpoint", "sync_endpoint"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

TOO_LARGE: Final = 1009
SEND_FAILED: Final = (OSError, RuntimeError)
"""What ASGI servers raise for a send on a closed websocket (uvicorn: an OSError
subclass when the client is gone, a RuntimeError after the close was sent)."""


class AsgiTransport:
    """One ASGI websocket as a :class:`~mycelia.node.transport.Transport`."""

    def __init__(self, scope: Scope, receive: Receive, send: Send, *, max_frame_bytes: int):
        self._scope = scope
        self._receive = receive
        self._send = send
        self._max = max_frame_bytes
        self._closed = False
        self._gone = False

    @property
    def remote(self) -> str:
        """The client's address, as the ASGI server reports it."""
        client = self._scope.get("client")
        return f"{client[0]}:{client[1]}" if client else "?"

    async def send(self, frame: bytes) -> None:
        """Send one binary message."""
        if self._closed:
            raise ConnectionClosed("this websocket is closed")
        try:
            await self._send({"type": "websocket.send", "bytes": bytes(frame)})
        except SEND_FAILED as exc:
            self._closed = True
            raise ConnectionClosed(f"websocket closed: {exc}") from exc

    async def recv(self) -> bytes:
        """The next binary message (a text message is a protocol error)."""
        if self._gone:
            raise ConnectionClosed("the websocket closed")
        message = await self._receive()
        kind = message.get("type")
        if kind == "websocket.disconnect":
            self._gone = self._closed = True
            raise ConnectionClosed(f"websocket closed: {message.get('code', 1005)}")
        if kind != "websocket.receive":
            raise RemoteProtocolError(f"unexpected ASGI message {kind!r}")
        data = message.get("bytes")
        if data is None:
            raise RemoteProtocolError("text frames are not part of this protocol")
        if len(data) > self._max:
            await self.close_because(TOO_LARGE, "frame too large")
            raise PayloadTooLarge(f"a frame of {len(data)} bytes is over {self._max}")
        return bytes(data)

    async def close(self) -> None:
        """Close the websocket (idempotent)."""
        await self.close_because(1000, "")

    async def close_because(self, code: int, reason: str) -> None:
        """Close with websocket close ``code`` and ``reason`` (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(*SEND_FAILED):
            await self._send({"type": "websocket.close", "code": code, "reason": reason})


class SyncEndpoint:
    """The ASGI application :func:`sync_endpoint` returns."""

    def __init__(
        self,
        node: Node | Callable[[], Node],
        *,
        request_timeout: float,
        handshake_timeout: float,
        outgoing_frames: int,
        metrics: Metrics,
    ) -> None:
        self._node = node
        self._request_timeout = request_timeout
        self._handshake_timeout = handshake_timeout
        self._outgoing_frames = outgoing_frames
        self.metrics = metrics
        self.connections: set[PeerConnection] = set()

    @property
    def node(self) -> Node:
        """The node served (a getter given at creation is called now)."""
        return self._node() if callable(self._node) else self._node

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection: a websocket peer, or 426 for plain HTTP."""
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
        elif scope["type"] == "http":
            await _upgrade_required(send)
        elif scope["type"] == "lifespan":  # run as the whole app: nothing to start
            await _lifespan(receive, send, self.close)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (await receive()).get("type") != "websocket.connect":
            return
        await send({"type": "websocket.accept"})
        node = self.node
        transport = AsgiTransport(scope, receive, send, max_frame_bytes=node.limits.max_frame_bytes)
        await serve_peer(
            node,
            transport,
            request_timeout=self._request_timeout,
            handshake_timeout=self._handshake_timeout,
            outgoing_frames=self._outgoing_frames,
            metrics=self.metrics,
            kind="asgi",
            peers=self.connections,
        )

    async def close(self, *, drain_timeout: float = 10.0) -> None:
        """Let in-flight requests finish (up to ``drain_timeout``), then close every peer."""
        peers = list(self.connections)
        await asyncio.gather(*(peer.drain(drain_timeout) for peer in peers))
        for peer in peers:
            await peer.close()


def sync_endpoint(
    node: Node | Callable[[], Node],
    *,
    request_timeout: float = 30.0,
    handshake_timeout: float = HANDSHAKE_TIMEOUT,
    outgoing_frames: int = OUTGOING_FRAMES,
    metrics: Metrics | None = None,
) -> SyncEndpoint:
    """An ASGI app serving ``node`` (or ``node()``, for a node opened at app start-up)
    to Mycelia peers over websockets. The options mean what they mean for
    :func:`mycelia.serve`; ``metrics`` is fed as the websockets server feeds its own
    (expose ``endpoint.metrics.registry`` with ``prometheus_client.make_asgi_app``)."""
    return SyncEndpoint(
        node,
        request_timeout=request_timeout,
        handshake_timeout=handshake_timeout,
        outgoing_frames=outgoing_frames,
        metrics=metrics or Metrics(),
    )


async def _upgrade_required(send: Send) -> None:
    body = b"this is a Mycelia sync endpoint: connect with a websocket client\n"
    await send(
        {
            "type": "http.response.start",
            "status": 426,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"upgrade", b"websocket"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Receive, send: Send, close: Callable[[], Awaitable[None]]) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await close()
            await send({"type": "lifespan.shutdown.complete"})
            return
