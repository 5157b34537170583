"""Serving peers over websockets: ``mycelia.serve(node, host, port)`` (ARCHITECTURE.md §7).

Each accepted connection is driven by :func:`serve_peer` — the one handler body that the
websockets server and the ASGI endpoint (:mod:`mycelia.asgi`) share — as a
:class:`~mycelia.node.peer.PeerConnection` until it closes. A faulty peer (garbage
frames, a wrong version, a forged event, a frame over the limit, no valid token) is
answered with a typed error or closed with a close code that says why; the server keeps
serving the others.

The same port answers plain HTTP (:mod:`mycelia.node.http`): ``GET /healthz`` and
``GET /metrics``. With ``ssl`` it serves ``wss://`` only.

Lifecycle: *serving* → :meth:`Server.start_draining` (``/healthz`` answers 503, new
websocket connections are refused with 503, open ones go on: a load balancer sees the
node leave) → :meth:`Server.close` (the listener closes, in-flight requests finish,
every connection closes).

Logs: one INFO line per connection with the peer id, address and the credentials'
subject; refusals (of a connection or a request) at WARNING with the reason; each commit
at DEBUG.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import logging
import socket
import ssl as ssl_module
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

from websockets.asyncio.server import Server as WsServer
from websockets.asyncio.server import ServerConnection
from websockets.asyncio.server import serve as ws_serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from mycelia.errors import ConnectionClosed, MyceliaError
from mycelia.node.http import HttpAnswer, HttpEndpoints
from mycelia.node.listen import bind
from mycelia.node.metrics import Metrics
from mycelia.node.peer import HANDSHAKE_TIMEOUT, OUTGOING_FRAMES, PeerConnection
from mycelia.node.policy import NamesSubjects
from mycelia.node.transport import Transport, WebsocketTransport
from mycelia.node.wiretap import MeteredTransport

if TYPE_CHECKING:
    from mycelia.entity import EntityChange
    from mycelia.node.node import Node

__all__ = ["Server", "serve", "serve_peer"]

log = logging.getLogger(__name__)


async def serve_peer(
    node: Node,
    transport: Transport,
    *,
    request_timeout: float = 30.0,
    handshake_timeout: float = HANDSHAKE_TIMEOUT,
    outgoing_frames: int = OUTGOING_FRAMES,
    metrics: Metrics | None = None,
    kind: str = "websocket",
    peers: set[PeerConnection] | None = None,
) -> PeerConnection:
    """Drive one accepted connection until it closes; returns it (``.error`` says why).

    ``metrics`` counts it (under transport ``kind``); ``peers`` holds it while it runs
    (so a server can drain it). Never raises for the peer's faults.
    """
    metrics = metrics or Metrics()
    meter = metrics.connection(kind)
    peer: PeerConnection | None = None
    tapped = MeteredTransport(
        transport,
        metrics,
        on_refusal=lambda request, error, text: _refused_request(node, peer, request, error, text),
        why=lambda: None if peer is None else peer.error,
    )
    peer = node.accept(
        tapped,
        request_timeout=request_timeout,
        handshake_timeout=handshake_timeout,
        outgoing_frames=outgoing_frames,
    )
    if peers is not None:
        peers.add(peer)
    runner = asyncio.ensure_future(peer.run())
    try:
        with contextlib.suppress(MyceliaError):
            await peer.wait_ready()
            meter.ready(durable=peer.peer_durable)
            _connected(node, peer)
        await runner
    finally:
        if not runner.done():
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
        if peers is not None:
            peers.discard(peer)
        meter.closed(_ended(peer))
    return peer


def _subject(node: Node, peer: PeerConnection) -> str:
    policy = node.policy
    name = policy.subject(peer.credentials) if isinstance(policy, NamesSubjects) else None
    return name or "anonymous"


def _connected(node: Node, peer: PeerConnection) -> None:
    subject = _subject(node, peer)
    log.info(
        "peer %s connected from %s as %s",
        peer.peer_id,
        peer.transport.remote,
        subject,
        extra={"peer": str(peer.peer_id), "address": peer.transport.remote, "subject": subject},
    )


def _ended(peer: PeerConnection) -> str:
    """``closed``, or the error class that ended the connection (logged as a refusal)."""
    error = peer.error
    if error is None or isinstance(error, ConnectionClosed):
        return "closed"
    reason = type(error).__name__
    log.warning(
        "refused peer %s from %s: %s: %s",
        peer.peer_id or "(before its presence)",
        peer.transport.remote,
        reason,
        error,
        extra={"peer": str(peer.peer_id), "address": peer.transport.remote, "reason": reason},
    )
    return reason


def _refused_request(
    node: Node, peer: PeerConnection | None, request: str, error: str, text: str
) -> None:
    if peer is None:  # pragma: no cover - the tap only sees responses once the peer runs
        return
    subject = _subject(node, peer)
    log.warning(
        "refused %s from peer %s (%s, %s): %s: %s",
        request,
        peer.peer_id,
        peer.transport.remote,
        subject,
        error,
        text,
        extra={"peer": str(peer.peer_id), "subject": subject, "reason": error},
    )


class ServedWebsocket(WebsocketTransport):
    """The server side of a websocket: closes with a code and reason that say why.

    Its socket sends each frame at once (``TCP_NODELAY``): the listening socket is bound
    before the server starts (``listen.bind``), and asyncio sets no-delay only on
    connections it accepts from sockets it made itself. Without it Nagle's algorithm holds
    an answer back behind a pushed update until the client's delayed ACK — 40 ms a commit.
    """

    def __init__(self, connection: ServerConnection) -> None:
        super().__init__(connection)
        self._connection = connection
        sock = connection.transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    async def close_because(self, code: int, reason: str) -> None:
        """Close with websocket close ``code`` and ``reason``."""
        await self._connection.close(code, reason)


class Server:
    """A running websocket server for one node; an async context manager."""

    def __init__(self, node: Node, metrics: Metrics, *, tls: bool) -> None:
        self.node = node
        self.metrics = metrics
        self.tls = tls
        self.connections: set[PeerConnection] = set()
        self.draining = False
        self._ws: WsServer | None = None
        self._unwatch: Callable[[], None] = lambda: None

    def listening(self, ws_server: WsServer, unwatch: Callable[[], None]) -> None:
        """Called once by :func:`serve` with the websockets server it started."""
        self._ws = ws_server
        self._unwatch = unwatch

    @property
    def serving(self) -> bool:
        """Whether it accepts new connections (what ``/healthz`` reports)."""
        return self._ws is not None and not self.draining

    @property
    def port(self) -> int:
        """The port it listens on (useful with ``port=0``)."""
        return int(self._socket().getsockname()[1])

    @property
    def host(self) -> str:
        """The address it listens on."""
        return str(self._socket().getsockname()[0])

    @property
    def url(self) -> str:
        """``ws://host:port`` (``wss://`` with TLS) for clients to dial."""
        host = self.host
        host = f"[{host}]" if ":" in host else host
        return f"{'wss' if self.tls else 'ws'}://{host}:{self.port}"

    def _socket(self) -> socket.socket:
        for sock in self._ws.sockets if self._ws is not None else ():
            return sock
        raise RuntimeError("the server is not listening")  # pragma: no cover

    def start_draining(self) -> None:
        """Answer ``/healthz`` with 503 and refuse new connections; open ones go on."""
        if not self.draining:
            self.draining = True
            log.info("draining: /healthz answers 503 and new connections are refused")

    async def close(self, *, drain_timeout: float = 10.0) -> None:
        """Stop accepting, let in-flight requests (commits) finish, then close everything."""
        self.start_draining()
        if self._ws is not None:  # stop accepting: a client dialling now is refused by TCP
            self._ws.close(close_connections=False)
        peers = list(self.connections)
        await asyncio.gather(*(peer.drain(drain_timeout) for peer in peers))
        for peer in peers:
            await peer.close()
        self._unwatch()
        if self._ws is not None:
            self._ws.close(close_connections=True)
            await self._ws.wait_closed()

    async def serve_forever(self) -> None:
        """Serve until cancelled."""
        if self._ws is not None:
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
    sock: socket.socket | None = None,
    ssl: ssl_module.SSLContext | None = None,
    compression: str | None = None,
    request_timeout: float = 30.0,
    handshake_timeout: float = HANDSHAKE_TIMEOUT,
    outgoing_frames: int = OUTGOING_FRAMES,
    metrics: Metrics | None = None,
    health: bool = True,
    metrics_endpoint: bool = True,
    metrics_auth: Callable[[bytes], bool] | None = None,
) -> Server:
    """Start serving ``node`` on ``host:port`` (``port=0`` picks a free one), or on
    ``sock``, a socket already bound (see :func:`mycelia.node.listen.bind`).

    ``ssl``: a server TLS context (``wss://`` only). ``handshake_timeout``: a peer that
    has not completed the handshake by then is closed. ``outgoing_frames``: frames queued
    for one peer before it counts as too slow and is disconnected (it can reconnect and
    catch up; memory stays bounded). ``health`` / ``metrics_endpoint`` turn ``/healthz``
    and ``/metrics`` on or off; ``metrics_auth(token)`` makes ``/metrics`` want a bearer
    token it accepts.

    Raises AddressInUse or ConfigError when ``host:port`` cannot be listened on.
    """
    metrics = metrics or Metrics()
    server = Server(node, metrics, tls=ssl is not None)
    endpoints = HttpEndpoints(
        serving=lambda: server.serving,
        metrics=metrics if metrics_endpoint else None,
        health=health,
        metrics_auth=metrics_auth,
    )

    async def handler(websocket: ServerConnection) -> None:
        await serve_peer(
            node,
            ServedWebsocket(websocket),
            request_timeout=request_timeout,
            handshake_timeout=handshake_timeout,
            outgoing_frames=outgoing_frames,
            metrics=metrics,
            peers=server.connections,
        )

    def process_request(connection: ServerConnection, request: Request) -> Response | None:
        answer = endpoints.answer("GET", request.path, request.headers.get("Authorization"))
        if answer is None and server.draining:
            answer = HttpAnswer(503, "text/plain; charset=utf-8", b"draining\n")
        return None if answer is None else _response(answer)

    ws_server = await ws_serve(
        handler,
        sock=sock or bind(host, port),
        ssl=ssl,
        max_size=node.limits.max_frame_bytes,
        compression=compression,
        process_request=process_request,
        ping_interval=20,
        close_timeout=2,  # a peer that will not finish the closing handshake is cut off
    )
    from mycelia import __version__  # noqa: PLC0415 - the package imports this module

    removers = (metrics.watch(node, version=__version__), node.on_change(_log_commit))

    def unwatch() -> None:
        for remove in removers:
            remove()

    server.listening(ws_server, unwatch)
    log.debug("serving node %s on %s", node.node_id, server.url)
    return server


def _log_commit(changes: list[EntityChange]) -> None:
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "commit: %d events on %s",
            sum(len(c.events) for c in changes),
            ", ".join(sorted({f"{c.after.collection}/{c.after.entity_id}" for c in changes})),
        )


def _response(answer: HttpAnswer) -> Response:
    status = http.HTTPStatus(answer.status)
    headers = Headers(
        [
            ("Connection", "close"),
            ("Content-Length", str(len(answer.body))),
            ("Content-Type", answer.content_type),
            *answer.headers,
        ]
    )
    return Response(status.value, status.phrase, headers, answer.body)
