"""The peer driver: one :class:`PeerSession` over one :class:`Transport`, for one node.

It owns the connection's tasks and bounds: a bounded outgoing queue (a peer that does not
read is disconnected rather than growing memory), a cap on requests in flight from the
peer (the reader stops reading while it is reached), a timeout on every request we make
(answered or failed with a typed error, never left hanging) and on the handshake (a
silent peer is closed). Requests from the peer are answered by the node's responder;
pushed updates go to the node's update handler. Everything the peer sends is validated
by the session and the applier before anything is staged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

from mycelia.errors import (
    ConnectionClosed,
    MyceliaError,
    PresenceRejected,
    ProtocolError,
    RemoteError,
    RemoteProtocolError,
    RequestTimeout,
)
from mycelia.node.policy import Credentials, PeerInfo
from mycelia.node.session import PeerSession, Received, SessionState, Verified
from mycelia.node.transport import Transport
from mycelia.proto import NodeId
from mycelia.proto.messages import Message, encode_frame
from mycelia.proto.peering import (
    CommitRequest,
    ErrorResponse,
    FetchRequest,
    GetEventsRequest,
    GetRequest,
    Presence,
    SubscribeRequest,
    SubscriptionUpdate,
    SystemRequest,
    UnsubscribeRequest,
)

if TYPE_CHECKING:
    from mycelia.node.node import Node

__all__ = ["DEFAULT_REQUEST_TIMEOUT", "PeerConnection"]

log = logging.getLogger(__name__)

DEFAULT_REQUEST_TIMEOUT: Final = 30.0
HANDSHAKE_TIMEOUT: Final = 10.0
OUTGOING_FRAMES: Final = 4096
REQUESTS_IN_FLIGHT: Final = 64

REQUESTS: Final = (
    GetRequest,
    GetEventsRequest,
    FetchRequest,
    SubscribeRequest,
    UnsubscribeRequest,
    CommitRequest,
    SystemRequest,
)

UpdateHandler = Callable[["PeerConnection", SubscriptionUpdate], Awaitable[None]]


class PeerConnection:
    """One live connection to a peer; :meth:`run` drives it until it closes."""

    def __init__(
        self,
        node: Node,
        transport: Transport,
        *,
        dialed: bool,
        token: bytes | None = None,
        on_update: UpdateHandler | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        outgoing_frames: int = OUTGOING_FRAMES,
    ) -> None:
        self.node = node
        self.transport = transport
        self.dialed = dialed
        self.session = PeerSession(
            key=node.key,
            durable=node.durable,
            system_root=node.system_root,
            limits=node.limits,
            token=token,
        )
        self._on_update = on_update
        self.request_timeout = request_timeout
        self._handshake_timeout = handshake_timeout
        self._pending: dict[int, asyncio.Future[Message]] = {}
        self._outgoing: asyncio.Queue[bytes | None] = asyncio.Queue(outgoing_frames)
        self._in_flight = asyncio.Semaphore(REQUESTS_IN_FLIGHT)
        self._tasks: set[asyncio.Task[None]] = set()
        self._answering: set[asyncio.Task[None]] = set()
        self._draining = False
        self._overflowed = False
        self._ready = asyncio.Event()
        self._closed = asyncio.Event()
        self.credentials = Credentials()
        self.peer_durable = False
        self.error: BaseException | None = None

    @property
    def peer(self) -> Presence | None:
        """The peer's Presence, once received."""
        return self.session.peer

    @property
    def peer_id(self) -> NodeId | None:
        """The peer's node id, once known."""
        return self.session.peer_id

    @property
    def ready(self) -> bool:
        """Whether the handshake completed and the connection is open."""
        return self._ready.is_set() and not self._closed.is_set()

    async def wait_ready(self) -> None:
        """Wait for the handshake; raises the connection's error if it closes first."""
        closed = asyncio.ensure_future(self._closed.wait())
        ready = asyncio.ensure_future(self._ready.wait())
        try:
            await asyncio.wait({closed, ready}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
            ready.cancel()
        if not self._ready.is_set() or self._closed.is_set():
            raise self.error or ConnectionClosed("the connection closed during the handshake")

    async def wait_closed(self) -> None:
        """Wait until the connection has closed."""
        await self._closed.wait()

    async def run(self) -> None:
        """Handshake, then serve until the connection closes. Never raises for peer faults:
        the reason is kept in :attr:`error`."""
        writer = asyncio.create_task(self._write_loop())
        try:
            for frame in self.session.start():
                self._enqueue(frame)
            async with asyncio.timeout(self._handshake_timeout):
                await self._read_until_ready()
            await self._read_loop()
        except (MyceliaError, TimeoutError) as exc:
            if self.error is None:  # a slow-consumer verdict is the real reason: keep it
                self.error = (
                    exc
                    if isinstance(exc, MyceliaError)
                    else RequestTimeout("the peer did not complete the handshake in time")
                )
            if not isinstance(exc, ConnectionClosed):
                log.info("closing connection to %s: %s", self.transport.remote, self.error)
        finally:
            await self._shutdown(writer)

    async def request(
        self, make: Callable[[int], Message], *, timeout: float | None = None
    ) -> Message:
        """Send the request ``make(request_id)`` and return its response.

        Raises:
            RemoteError: the peer answered with an error (``kind`` names it).
            RequestTimeout: no answer within the timeout.
            ConnectionClosed: the connection closed first.
        """
        if not self.ready:
            raise ConnectionClosed("the connection is not ready")
        rid = self.session.next_request_id()
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        try:
            self._enqueue(encode_frame(make(rid)))
            async with asyncio.timeout(timeout or self.request_timeout):
                response = await future
        except TimeoutError as exc:
            raise RequestTimeout(
                f"no answer from {self.transport.remote} to request {rid}"
            ) from exc
        finally:
            self._pending.pop(rid, None)
        if isinstance(response, ErrorResponse):
            raise RemoteError(f"{response.kind}: {response.text}", kind=response.kind)
        return response

    def push(self, msg: Message) -> None:
        """Send ``msg`` without waiting (updates); a peer too slow to take it is dropped."""
        if not self._closed.is_set():
            self._enqueue(encode_frame(msg))

    async def drain(self, timeout: float) -> None:
        """Refuse new requests and wait (up to ``timeout``) for those being answered."""
        self._draining = True
        if self._answering:
            await asyncio.wait(set(self._answering), timeout=timeout)

    async def close(self) -> None:
        """Close the connection (pending requests fail with ConnectionClosed)."""
        await self.transport.close()
        await self._closed.wait()

    # -- internals -----------------------------------------------------------------------

    def _enqueue(self, frame: bytes) -> None:
        if self._overflowed:
            return  # already being disconnected: drop, do not queue without bound
        try:
            self._outgoing.put_nowait(frame)
        except asyncio.QueueFull:
            log.warning("peer %s is not reading: disconnecting it", self.transport.remote)
            self._overflowed = True
            self.error = ConnectionClosed("slow consumer: outgoing queue full")
            while not self._outgoing.empty():  # free the memory now; stop the writer
                self._outgoing.get_nowait()
            self._outgoing.put_nowait(None)
            self.spawn(self.transport.close())

    async def _write_loop(self) -> None:
        with contextlib.suppress(ConnectionClosed, ProtocolError, OSError):
            while (frame := await self._outgoing.get()) is not None:
                await self.transport.send(frame)

    async def _read_until_ready(self) -> None:
        while self.session.state is not SessionState.READY:
            await self._receive_one()

    async def _read_loop(self) -> None:
        while True:
            await self._in_flight.acquire()  # backpressure: stop reading at the cap
            self._in_flight.release()
            await self._receive_one()

    async def _receive_one(self) -> None:
        frame = await self.transport.recv()
        try:
            events = self.session.receive(frame)
        finally:
            for out in self.session.take_outgoing():
                self._enqueue(out)
        for event in events:
            if isinstance(event, Verified):
                self._verified(event)
            else:
                self._received(event)

    def _verified(self, event: Verified) -> None:
        presence = event.presence
        info = PeerInfo(presence.node_id, presence.durable, self.dialed)
        self.credentials = Credentials(event.token)
        self.node.policy.check_connect(info, self.credentials)
        # "durable" is never taken on the peer's word (ARCHITECTURE.md §7).
        self.peer_durable = presence.durable and (
            self.dialed or self.node.policy.trusts_durable(info)
        )
        if self.node.system_root is not None and presence.system_root not in (
            None,
            self.node.system_root,
        ):
            raise PresenceRejected(f"the peer belongs to another system ({presence.system_root})")
        self._ready.set()
        log.info(
            "peer %s connected from %s (%s)",
            presence.node_id,
            self.transport.remote,
            "durable" if self.peer_durable else "ephemeral",
        )

    def _received(self, event: Received) -> None:
        msg = event.message
        rid = getattr(msg, "request_id", None)
        if isinstance(msg, SubscriptionUpdate):
            if self._on_update is None:
                raise RemoteProtocolError("this node holds no subscription with the peer")
            self.spawn(self._on_update(self, msg))
        elif isinstance(msg, REQUESTS):
            if self._draining:
                self.push(
                    ErrorResponse(msg.request_id, "ConnectionClosed", "the node is shutting down")
                )
                return
            task = asyncio.ensure_future(self._answer(msg))
            self._tasks.add(task)
            self._answering.add(task)
            task.add_done_callback(self._tasks.discard)
            task.add_done_callback(self._answering.discard)
        elif rid is not None and rid in self._pending:
            future = self._pending.pop(rid)
            if not future.done():
                future.set_result(msg)
        else:
            log.debug("dropping a response to an unknown request %s", rid)

    async def _answer(self, msg: Message) -> None:
        async with self._in_flight:
            rid = getattr(msg, "request_id", 0)
            try:
                response = await self.node.responder.handle(self, msg)
            except MyceliaError as exc:
                response = ErrorResponse(rid, type(exc).__name__, str(exc)[:4000])
            except Exception as exc:  # a bug must not leave the peer hanging
                log.exception("request %s from %s failed", rid, self.transport.remote)
                response = ErrorResponse(rid, "InternalError", type(exc).__name__)
            self.push(response)

    def spawn(self, coro: Awaitable[None]) -> None:
        """Run ``coro`` as a task owned by this connection (cancelled when it closes)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _shutdown(self, writer: asyncio.Task[None]) -> None:
        self.session.close()
        self._closed.set()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionClosed("the connection closed"))
        with contextlib.suppress(asyncio.QueueFull):
            self._outgoing.put_nowait(None)
        try:
            async with asyncio.timeout(1.0):
                await writer  # flush what is queued (a rejection, a last answer)
        except TimeoutError:
            writer.cancel()
        await self.transport.close()
        for task in list(self._tasks):
            task.cancel()
        if self.peer is not None and self._ready.is_set():
            log.info("peer %s disconnected (%s)", self.peer.node_id, self.error or "closed")
