"""Serving peers over websockets: ``mycelia.serve(node, host, port)`` (ARCHITECTURE.md §7).

Each accepted connection is driven by :func:`serve_peer` — the one handler body that the
websockets server and the ASGI endpoint (:mod:`mycelia.asgi`) share — as a
:class:`~mycelia.node.peer.PeerConnection` until it closes. A faulty peer (garbage
frames, a wrong version, a forged event, a frame over the limit, no valid token) is
answered with a typed error or closed with a close code that says why; the server keeps
serving the others.

The same port answers plain HTTP (:mod:`mycelia.node.http`): ``GET /healthz`` and
``GET /metrics``. With ``ssl`` it serves ``wss://`` only. What bounds a connection before
and beside the session (how many, how big and how slow its frames may be) is in
:mod:`mycelia.node.connections`.

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
from collections.abc import Awaitable, Callable
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Final

from websockets.asyncio.server import Server as WsServer
from websockets.asyncio.server import ServerConnection
from websockets.asyncio.server import serve as ws_serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from mycelia.errors import ConnectionClosed, MyceliaError, Overloaded
from mycelia.node.budget import DEFAULT_BOUNDS, Bounds
from mycelia.node.connections import (
    MAX_CONNECTIONS,
    PARTIAL_BYTES,
    UNFINISHED_TIMEOUT,
    Admission,
    Partial,
    connection_class,
)
from mycelia.node.http import HttpAnswer, HttpEndpoints
from mycelia.node.listen import bind
from mycelia.node.metrics import ConnectionMeter, Metrics
from mycelia.node.peer import HANDSHAKE_TIMEOUT, OUTGOING_FRAMES, PeerConnection
from mycelia.node.policy import NamesSubjects
from mycelia.node.tasks import stop
from mycelia.node.transport import Transport, WebsocketTransport, close_reason
from mycelia.node.wiretap import MeteredTransport

if TYPE_CHECKING:
    from mycelia.entity import EntityChange
    from mycelia.node.node import Node

__all__ = [
    "MAX_CONNECTIONS",
    "PARTIAL_BYTES",
    "QUEUED_FRAMES",
    "UNFINISHED_TIMEOUT",
    "Server",
    "serve",
    "serve_peer",
]

log = logging.getLogger(__name__)

QUEUED_FRAMES: Final = 2
"""Whole frames websockets holds per connection for the session to take."""


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
    bounds: Bounds = DEFAULT_BOUNDS,
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
        bounds=bounds,
    )
    if peers is not None:
        peers.add(peer)
    try:
        await _drive(node, peer, meter)
    finally:
        if peers is not None:
            peers.discard(peer)
        meter.closed(_ended(peer))
    return peer


async def _drive(node: Node, peer: PeerConnection, meter: ConnectionMeter) -> None:
    """Run ``peer`` until it closes, counting and logging it once it is ready (a peer
    that never gets there ends the same way: its error is kept on it). If the caller is
    cancelled, the run is cancelled too and waited for."""
    runner = asyncio.ensure_future(peer.run())
    try:
        with contextlib.suppress(MyceliaError):
            await peer.wait_ready()
            meter.ready(durable=peer.peer_durable)
            _connected(node, peer)
        await runner
    finally:
        if not runner.done():
            await stop(runner)


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

    def allow_frames(self, max_bytes: int) -> None:
        """Nothing to do: the connection bounds the handshake's frames itself (see the
        module docstring)."""

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
        self.partial = Partial(PARTIAL_BYTES)
        """The unfinished messages of every connection (see the module docstring)."""
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
    bounds: Bounds = DEFAULT_BOUNDS,
    max_connections: int = MAX_CONNECTIONS,
    max_connections_per_ip: int | None = None,
    unfinished_timeout: float = UNFINISHED_TIMEOUT,
    partial_bytes: int = PARTIAL_BYTES,
) -> Server:
    """Start serving ``node`` on ``host:port`` (``port=0`` picks a free one), or on
    ``sock``, a socket already bound (see :func:`mycelia.node.listen.bind`).

    ``ssl``: a server TLS context (``wss://`` only). ``handshake_timeout``: a peer that
    has not completed the handshake by then is closed. ``outgoing_frames``: frames queued
    for one peer before it counts as too slow and is disconnected (it can reconnect and
    catch up; memory stays bounded). ``health`` / ``metrics_endpoint`` turn ``/healthz``
    and ``/metrics`` on or off; ``metrics_auth(token)`` makes ``/metrics`` want a bearer
    token it accepts. ``bounds`` (per connection), ``max_connections``,
    ``max_connections_per_ip``, ``unfinished_timeout`` and ``partial_bytes``: see the
    module docstring.

    Raises AddressInUse or ConfigError when ``host:port`` cannot be listened on.
    """
    server = Server(node, metrics or Metrics(), tls=ssl is not None)
    server.partial = Partial(partial_bytes)
    accept = partial(
        serve_peer,
        node,
        request_timeout=request_timeout,
        handshake_timeout=handshake_timeout,
        outgoing_frames=outgoing_frames,
        metrics=server.metrics,
        peers=server.connections,
        bounds=bounds,
    )
    await _start(
        server,
        _admitting(Admission(total=max_connections, per_ip=max_connections_per_ip), accept),
        _http_answers(server, health=health, expose=metrics_endpoint, auth=metrics_auth),
        sock or bind(host, port),
        ssl=ssl,
        compression=compression,
        unfinished_timeout=unfinished_timeout,
    )
    return server


def _admitting(
    admission: Admission, accept: Callable[[Transport], Awaitable[object]]
) -> Callable[[ServerConnection], Awaitable[None]]:
    """The websockets handler: a connection within the ``admission`` bounds is served
    with ``accept`` until it closes; one beyond them is closed at once (1013)."""

    async def handler(websocket: ServerConnection) -> None:
        address = websocket.remote_address[0] if websocket.remote_address else "?"
        try:
            admission.enter(str(address))
        except Overloaded as exc:
            log.warning("refused a connection from %s: %s", address, exc)
            await websocket.close(1013, close_reason(exc))  # 1013: try again later
            return
        try:
            await accept(ServedWebsocket(websocket))
        finally:
            admission.leave(str(address))

    return handler


def _http_answers(
    server: Server, *, health: bool, expose: bool, auth: Callable[[bytes], bool] | None
) -> Callable[[ServerConnection, Request], Response | None]:
    """websockets' ``process_request``: ``/healthz`` and (if ``expose``) ``/metrics``
    answered over plain HTTP; while draining, any other request is refused with 503."""
    endpoints = HttpEndpoints(
        serving=lambda: server.serving,
        metrics=server.metrics if expose else None,
        health=health,
        metrics_auth=auth,
    )

    def process_request(connection: ServerConnection, request: Request) -> Response | None:
        answer = endpoints.answer("GET", request.path, request.headers.get("Authorization"))
        if answer is None and server.draining:
            answer = HttpAnswer(503, "text/plain; charset=utf-8", b"draining\n")
        return None if answer is None else _response(answer)

    return process_request


async def _start(
    server: Server,
    handler: Callable[[ServerConnection], Awaitable[None]],
    answers: Callable[[ServerConnection, Request], Response | None],
    sock: socket.socket,
    *,
    ssl: ssl_module.SSLContext | None,
    compression: str | None,
    unfinished_timeout: float,
) -> None:
    """Listen on ``sock`` with websockets, bounded as the module docstring says, and
    watch the node (metrics, commit logs) until the server closes."""
    node = server.node
    ws_server = await ws_serve(
        handler,
        sock=sock,
        ssl=ssl,
        max_size=node.limits.max_frame_bytes,
        max_queue=QUEUED_FRAMES,
        compression=compression,
        process_request=answers,
        ping_interval=20,
        close_timeout=2,  # a peer that will not finish the closing handshake is cut off
        create_connection=connection_class(
            server.partial, unfinished_timeout, node.limits.max_handshake_bytes
        ),
    )
    from mycelia import __version__  # noqa: PLC0415 - the package imports this module

    removers = (
        server.metrics.watch(node, version=__version__),
        node.on_change(_log_commit, everything=False),
    )

    def unwatch() -> None:
        for remove in removers:
            remove()

    server.listening(ws_server, unwatch)
    log.debug("serving node %s on %s", node.node_id, server.url)


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
