"""The peer driver: one :class:`PeerSession` over one :class:`Transport`, for one node.

It owns the connection's tasks and bounds, all counted in bytes (:mod:`mycelia.node.budget`):
the outgoing queue (a peer that does not read is cut off rather than growing memory; an
answer waits for room, and for the node's answer pool, before it is even encoded), the
requests in flight from the peer (the reader stops reading at the bound), a timeout on
every request we wait for (answered or failed with a typed error, never left hanging) and
on the handshake (a silent peer is closed). Before the handshake completes a frame may be
at most ``limits.max_handshake_bytes`` (the transport is told to refuse bigger ones when
it can; the session checks anyway). Everything the peer sends is validated by the session
and the applier before anything is staged.

Errors travel as codes both ways: a request that fails here, or that could not even be
decoded, is answered with an :class:`~mycelia.proto.peering.ErrorResponse` and the
connection goes on; a peer's error response is raised as :func:`mycelia.errors.remote`
(the typed error, also a RemoteError). Our requests wait for their answers in
:mod:`mycelia.node.outstanding`, which joins a paged answer's pages with its final response
(or, for :meth:`PeerConnection.stream`, hands each page over as it arrives).

Requests from the peer go to the node's :class:`~mycelia.node.ports.Answers` (the
responder): each is answered as it comes, except commits, which one worker per
connection takes **in arrival order**, handing the responder every commit that arrived
while the previous ones were applied, so a client's pipelined commits are applied in the
order it made them and share one storage write. Pushed updates go to ``on_update``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from typing import Final, TypeVar

from mycelia.errors import (
    ConnectionClosed,
    MyceliaError,
    NotConnected,
    Overloaded,
    PolicyDenied,
    PresenceRejected,
    ProtocolError,
    RemoteProtocolError,
    RequestTimeout,
)
from mycelia.node.budget import DEFAULT_BOUNDS, Bounds, wait_for_room
from mycelia.node.outstanding import Outstanding, Streamed, seen
from mycelia.node.peer_parts import (
    Committed,
    Committer,
    Identity,
    UpdateHandler,
    answer_size,
    new_budgets,
    new_session,
)
from mycelia.node.policy import Credentials, PeerInfo
from mycelia.node.ports import Answers, Gate, MakeRequest
from mycelia.node.session import Faulty, Pushed, Received, SessionState, Verified
from mycelia.node.transport import Transport, allow_frames
from mycelia.proto import NodeId
from mycelia.proto.messages import PROTOCOL_VERSION, Message, encode_frame
from mycelia.proto.peering import (
    REQUESTS,
    CommitRequest,
    CommitsRequest,
    ErrorResponse,
    Presence,
    SubscriptionEnded,
    expect_response,
)
from mycelia.proto.peering import PresenceRejected as PresenceRejectedMessage

__all__ = ["DEFAULT_REQUEST_TIMEOUT", "PeerConnection"]

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)

DEFAULT_REQUEST_TIMEOUT: Final = 30.0
HANDSHAKE_TIMEOUT: Final = 10.0
OUTGOING_FRAMES: Final = 4096
"""Frames queued for one peer (besides their bytes) before it counts as too slow."""
_RESERVED: Final[ContextVar[list[int] | None]] = ContextVar("mycelia_reserved", default=None)
"""In an answering task: the room reserved for its answer's first frame (see _answer)."""


class PeerConnection:
    """One live connection to a peer; :meth:`run` drives it until it closes."""

    def __init__(
        self,
        transport: Transport,
        *,
        me: Identity,
        gate: Gate,
        answers: Answers,
        dialed: bool,
        token: bytes | None = None,
        on_update: UpdateHandler | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        outgoing_frames: int = OUTGOING_FRAMES,
        bounds: Bounds = DEFAULT_BOUNDS,
    ) -> None:
        self.transport = transport
        self.dialed = dialed
        self._me = me
        self._gate = gate
        self._answers = answers
        self.session = new_session(me, token=token, dialed=dialed)
        self._on_update = on_update
        self.request_timeout = request_timeout
        self._handshake_timeout = handshake_timeout
        self._bounds = bounds
        self._outstanding = Outstanding()
        self._outgoing, self._in_flight = new_budgets(bounds, me.answers, outgoing_frames)
        self._tasks: dict[asyncio.Task[None], None] = {}  # ordered: cancelled in start order
        self.frames_read = 0
        """Frames read from the peer so far (the commit pipeline's sign of a live peer)."""
        self._answering: set[asyncio.Future[None]] = set()
        """The answers being built and the batch of commits being applied (drain waits)."""
        self._committer = Committer(self._commit, self._answering)
        self._committing: asyncio.Task[None] | None = None
        self._draining = False
        self._overflowed = False
        self._ready = asyncio.Event()
        self._closed = asyncio.Event()
        self.credentials = Credentials()
        self.peer_durable = False
        self.error: BaseException | None = None

    @property
    def remote(self) -> str:
        """Who is on the other side (for logs)."""
        return self.transport.remote

    @property
    def peer(self) -> Presence | None:
        """The peer's Presence, once received."""
        return self.session.peer

    @property
    def peer_id(self) -> NodeId | None:
        """The peer's node id, once known."""
        return self.session.peer_id

    @property
    def page_bytes(self) -> int:
        """How much one page of an answer to this peer aims to carry."""
        frame = self._me.limits.max_frame_bytes
        return max(1, min(self._bounds.page_bytes, self._me.limits.max_entity_bytes, frame))

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
        if not self.ready:
            raise self.error or ConnectionClosed("the connection closed during the handshake")

    async def wait_closed(self) -> None:
        """Wait until the connection has closed."""
        await self._closed.wait()

    async def run(self) -> None:
        """Handshake, then serve until the connection closes. Never raises for peer faults:
        the reason is kept in :attr:`error`."""
        writer = asyncio.create_task(self._write_loop())
        self._committing = asyncio.create_task(self._committer.run())  # ends once closed
        try:
            allow_frames(self.transport, self._me.limits.max_handshake_bytes)
            for frame in self.session.start():
                self._enqueue(frame)
            async with asyncio.timeout(self._handshake_timeout):
                await self._read_until_ready()
            allow_frames(self.transport, self._me.limits.max_frame_bytes)
            await self._read_loop()
        except (MyceliaError, TimeoutError) as exc:
            if self.error is None:  # a slow-consumer verdict is the real reason: keep it
                self.error = (
                    exc
                    if isinstance(exc, MyceliaError)
                    else RequestTimeout("the peer did not complete the handshake in time")
                )
            if not isinstance(exc, ConnectionClosed):
                log.info("closing connection to %s: %s", self.remote, self.error)
        finally:
            await self._shutdown(writer)

    def submit(
        self, make: MakeRequest, *, pages: Callable[[Message], None] | None = None
    ) -> asyncio.Future[Message]:
        """Send the request ``make(request_id)`` now; its response arrives in the future
        (with ``pages``, each page of a paged answer goes there as it arrives, and the
        future gets the final response alone).

        The future raises RemoteError (the peer answered with an error) or
        ConnectionClosed (the connection closed first); it has no timeout of its own.
        """
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        if not self.ready:
            future.add_done_callback(seen)
            future.set_exception(NotConnected("the connection is not ready"))
            return future
        rid = self.session.next_request_id()
        self._outstanding.add(rid, future, pages=pages)
        self._outgoing.force(encode_frame(make(rid)))  # our own request: its caller bounds it
        return future

    async def request(
        self, make: MakeRequest, *, expect: type[M], timeout: float | None = None
    ) -> M:
        """Send ``make(request_id)`` and return its response, an ``expect``.

        Raises:
            RemoteError: the peer answered with an error (an instance of the class its
                code names too, see :func:`mycelia.errors.remote`).
            RemoteProtocolError: it answered with something other than an ``expect``.
            RequestTimeout: no answer within the timeout.
            NotConnected: the connection was not ready: nothing was sent.
            ConnectionClosed: the connection closed first.
        """
        future = self.submit(make)
        try:
            async with asyncio.timeout(timeout or self.request_timeout):
                response = await future
        except TimeoutError as exc:
            raise RequestTimeout(f"no answer from {self.remote} to a request") from exc
        finally:
            future.cancel()
        return expect_response(response, expect)

    def stream(self, make: MakeRequest, *, timeout: float | None = None) -> Streamed:
        """Send ``make(request_id)``; ``async with`` the result, iterate it for the answer's
        pages as they arrive, then its final response
        (:class:`~mycelia.node.outstanding.Streamed`)."""
        streamed = Streamed(timeout or self.request_timeout)
        streamed.waits_for(self.submit(make, pages=streamed.page))
        return streamed

    def push(self, msg: Message) -> None:
        """Send ``msg`` without waiting (updates, small answers); a peer whose outgoing
        budget cannot take it is cut off as a slow consumer."""
        if not self._closed.is_set():
            self._enqueue(encode_frame(msg))

    async def send(self, msg: Message, *, size: int) -> None:
        """Send ``msg`` (at most ``size`` bytes encoded), waiting for room in this peer's
        outgoing budget and the node's answer pool before encoding it (an answer's first
        frame uses the room its request reserved). A peer that lets it wait the stall
        timeout with nothing written to it meanwhile is cut off as a slow consumer (then
        this raises ConnectionClosed)."""
        if self._gone():
            raise ConnectionClosed("the connection closed")
        slot = _RESERVED.get()
        if self._outgoing.put_now(size, lambda: encode_frame(msg), slot=slot):
            return  # room was there: no waiting task (most sends, one per push)
        await self._wait_room(self._outgoing.put(size, lambda: encode_frame(msg), slot=slot))

    async def _wait_room(self, waiting: Coroutine[object, object, None]) -> None:
        """Run ``waiting`` until there is room (:func:`~mycelia.node.budget.wait_for_room`)."""
        stall = self._bounds.stall_timeout
        await wait_for_room(
            waiting, self._outgoing, stall_timeout=stall, gone=self._gone, cut_off=self.cut_off
        )

    def _gone(self) -> bool:
        """Whether the connection closed or is being cut off."""
        return self._closed.is_set() or self._overflowed

    def check_credentials(self) -> None:
        """Raise PolicyDenied (or PresenceRejected) if what the peer proved at the
        handshake no longer admits it (an expired token, say)."""
        peer = self.session.peer
        if peer is None:
            raise ConnectionClosed("the peer never completed the handshake")
        info = PeerInfo(peer.node_id, peer.durable, self.dialed)
        self._gate.admit(info, self.credentials, peer.system_root)

    async def drain(self, timeout: float) -> None:
        """Refuse new requests and wait (up to ``timeout``) for those being answered."""
        self._draining = True
        if self._answering:
            await asyncio.wait(set(self._answering), timeout=timeout)

    async def close(self) -> None:
        """Close the connection (pending requests fail with ConnectionClosed)."""
        await self.transport.close()
        await self._closed.wait()

    @property
    def closed(self) -> bool:
        """Whether the connection closed or is closing: nothing more of it runs."""
        return self._closed.is_set()

    def spawn(self, coro: Coroutine[object, object, None]) -> None:
        """Run ``coro`` as a task owned by this connection, cancelled when it closes (one
        begun as it closes would outlive it: ``coro`` is then closed unrun)."""
        if self._closed.is_set():
            coro.close()
        else:
            self._own(asyncio.ensure_future(coro))

    def _own(self, task: asyncio.Task[None]) -> None:
        self._tasks[task] = None
        task.add_done_callback(lambda done: self._tasks.pop(done, None))

    # -- internals -----------------------------------------------------------------------

    def _enqueue(self, frame: bytes) -> None:
        if self._overflowed:
            return  # already being disconnected: drop, do not queue without bound
        if not self._outgoing.offer(frame):
            self.cut_off(
                f"{self._outgoing.queued_bytes} bytes queued, the budget is "
                f"{self._bounds.outgoing_bytes}"
            )

    def cut_off(self, why: str) -> None:
        """Disconnect a peer that does not read what it is sent (memory stays bounded)."""
        if self._overflowed:
            return
        log.warning("peer %s is not reading: disconnecting it (%s)", self.remote, why)
        self._overflowed = True
        self.error = Overloaded(f"slow consumer: {why}")
        self._outgoing.close(drop=True)  # free the memory now; stop the writer
        self.spawn(self.transport.close())

    async def _write_loop(self) -> None:
        with contextlib.suppress(ConnectionClosed, ProtocolError, OSError):
            while (item := await self._outgoing.get()) is not None:
                try:
                    await self.transport.send(item[0])
                finally:
                    self._outgoing.written(item)

    async def _read_until_ready(self) -> None:
        while self.session.state is not SessionState.READY:
            await self._receive_one()

    async def _read_loop(self) -> None:
        while True:
            await self._in_flight.wait_room()  # backpressure: stop reading at the bounds
            await self._receive_one()

    async def _receive_one(self) -> None:
        """Read one frame and act on it (a request is counted in flight until answered)."""
        frame = await self.transport.recv()
        self.frames_read += 1
        try:
            events = self.session.receive(frame)
        finally:
            for out in self.session.take_outgoing():
                self._enqueue(out)
        for event in events:
            if isinstance(event, Verified):
                self._verified(event)
            elif isinstance(event, Faulty):
                self.push(ErrorResponse.of(event.request_id, event.error))
            elif isinstance(event, Pushed):
                self._pushed(event)
            else:
                self._received(event, len(frame))

    def _verified(self, event: Verified) -> None:
        presence = event.presence
        info = PeerInfo(presence.node_id, presence.durable, self.dialed)
        self.credentials = Credentials(event.token)
        try:
            # "durable" is never taken on the peer's word (ARCHITECTURE.md §7): the gate decides.
            self.peer_durable = self._gate.admit(info, self.credentials, presence.system_root)
        except (PolicyDenied, PresenceRejected) as exc:
            # Tell the peer why, in the protocol, before closing: its client stops retrying.
            reason = f"{type(exc).__name__}: {exc}"[:4000]
            self._enqueue(
                encode_frame(PresenceRejectedMessage(reason, PROTOCOL_VERSION, PROTOCOL_VERSION))
            )
            raise
        self._ready.set()
        log.debug(
            "peer %s connected from %s (%s)",
            presence.node_id,
            self.remote,
            "durable" if self.peer_durable else "ephemeral",
        )

    def _received(self, event: Received, size: int) -> None:
        msg = event.message
        if isinstance(msg, SubscriptionEnded):  # (an update comes as Pushed)
            self._pushed(msg)
            return
        if isinstance(msg, REQUESTS):
            self._request(msg, size)
            return
        self._outstanding.answer(msg, size)

    def _pushed(self, update: Pushed | SubscriptionEnded) -> None:
        if self._on_update is None:
            raise RemoteProtocolError("this node holds no subscription with the peer")
        work = self._on_update(update)
        if work is not None:
            self.spawn(work)

    def _request(self, msg: Message, size: int) -> None:
        rid = int(getattr(msg, "request_id", 0))  # every request carries one
        if self._draining:
            self.push(ErrorResponse.of(rid, ConnectionClosed("the node is shutting down")))
            return
        self._in_flight.add(size)
        if isinstance(msg, CommitRequest | CommitsRequest):
            self._committer.add(msg, size)
            return
        task = asyncio.ensure_future(self._answer(msg, size))
        self._own(task)
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    async def _answer(self, msg: Message, size: int) -> None:
        """Answer one request: room for its first page is reserved before anything is
        built (so a peer cannot have many large answers built and held at once)."""
        rid = getattr(msg, "request_id", 0)
        slot = [0]
        token = _RESERVED.set(slot)
        try:
            await self._wait_room(self._reserve(slot))
            try:
                response = await self._answers.handle(self, msg)
            except MyceliaError as exc:
                response = ErrorResponse.of(rid, exc)
            except Exception as exc:  # a bug must not leave the peer hanging
                log.exception("request %s from %s failed", rid, self.remote)
                error = MyceliaError(f"internal error: {type(exc).__name__}")
                response = ErrorResponse.of(rid, error)
            if response is not None:  # (else the responder sent it)
                await self.send(response, size=answer_size(response))
        except ConnectionClosed:
            pass  # the peer is gone, or was cut off: nobody is waiting
        finally:
            _RESERVED.reset(token)
            if slot[0]:
                self._outgoing.unreserve(slot[0])
            self._in_flight.done(size)

    async def _reserve(self, slot: list[int]) -> None:
        await self._outgoing.reserve(self.page_bytes)
        slot[0] = self.page_bytes  # in the same step as the reserve's end: nothing leaks

    async def _commit(self, batch: Committed) -> None:
        requests = [request for request, _ in batch]
        try:
            responses = await self._answers.commit(self, requests)
        except Exception as exc:  # a bug must not leave the peer hanging
            log.exception("%d commits from %s failed", len(batch), self.remote)
            error = MyceliaError(f"internal error: {type(exc).__name__}")
            responses = [ErrorResponse.of(m.request_id, error) for m in requests]
        for response, (_, size) in zip(responses, batch, strict=True):
            self._in_flight.done(size)
            self.push(response)

    async def _shutdown(self, writer: asyncio.Task[None]) -> None:
        self.session.close()
        self._closed.set()
        self._committer.stop()  # (after the batch it applies)
        ended = self.error if isinstance(self.error, ConnectionClosed) else None
        self._outstanding.close(ended)
        self._outgoing.close(drop=False)
        try:
            async with asyncio.timeout(1.0):
                await writer  # flush what is queued (a rejection, a last answer)
        except TimeoutError:
            writer.cancel()
        finally:  # cancelled meanwhile (the server stops), it still lets go of everything
            self._outgoing.close(drop=True)
            for task in list(self._tasks):
                task.cancel()
            self._answers.forget(self)
        await self.transport.close()
        if self.peer is not None and self._ready.is_set():
            log.info("peer %s disconnected (%s)", self.peer.node_id, self.error or "closed")
