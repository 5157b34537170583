"""The peer driver: one :class:`PeerSession` over one :class:`Transport`, for one node.

It owns the connection's tasks and bounds: a bounded outgoing queue (a peer that does not
read is disconnected rather than growing memory), a cap on requests in flight from the
peer (the reader stops reading while it is reached), a timeout on every request we wait
for (answered or failed with a typed error, never left hanging) and on the handshake (a
silent peer is closed). Everything the peer sends is validated by the session and the
applier before anything is staged.

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
from dataclasses import dataclass
from typing import Final, TypeVar

from mycelia.errors import (
    ConnectionClosed,
    MyceliaError,
    PolicyDenied,
    PresenceRejected,
    ProtocolError,
    RemoteError,
    RemoteProtocolError,
    RequestTimeout,
)
from mycelia.node.identity import NodeKey
from mycelia.node.policy import Credentials, PeerInfo
from mycelia.node.ports import Answers, Gate, MakeRequest
from mycelia.node.session import PeerSession, Received, SessionState, Verified
from mycelia.node.transport import Transport
from mycelia.proto import EntityId, Limits, NodeId
from mycelia.proto.messages import PROTOCOL_VERSION, Message, encode_frame
from mycelia.proto.peering import (
    CHALLENGE_LENGTH,
    REQUESTS,
    CommitRequest,
    ErrorResponse,
    Presence,
    SubscriptionUpdate,
    expect_response,
)
from mycelia.proto.peering import PresenceRejected as PresenceRejectedMessage

__all__ = ["DEFAULT_REQUEST_TIMEOUT", "Identity", "PeerConnection"]

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)

DEFAULT_REQUEST_TIMEOUT: Final = 30.0
HANDSHAKE_TIMEOUT: Final = 10.0
OUTGOING_FRAMES: Final = 4096
REQUESTS_IN_FLIGHT: Final = 64

UpdateHandler = Callable[[SubscriptionUpdate], Coroutine[object, object, None]]


@dataclass(frozen=True, slots=True)
class Identity:
    """What a connection presents of this node."""

    key: NodeKey
    durable: bool
    limits: Limits
    system_root: Callable[[], EntityId | None]
    entropy: Callable[[int], bytes]
    """The node's entropy (handshake challenges)."""


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
    ) -> None:
        self.transport = transport
        self.dialed = dialed
        self._me = me
        self._gate = gate
        self._answers = answers
        self.session = PeerSession(
            key=me.key,
            durable=me.durable,
            system_root=me.system_root(),
            limits=me.limits,
            token=token,
            challenge=me.entropy(CHALLENGE_LENGTH),
        )
        self._on_update = on_update
        self.request_timeout = request_timeout
        self._handshake_timeout = handshake_timeout
        self._pending: dict[int, asyncio.Future[Message]] = {}
        self._outgoing: asyncio.Queue[bytes | None] = asyncio.Queue(outgoing_frames)
        self._slots = asyncio.Semaphore(REQUESTS_IN_FLIGHT)
        self._commits: list[CommitRequest] = []
        self._commits_waiting = asyncio.Event()
        self._tasks: dict[asyncio.Task[None], None] = {}  # ordered: cancelled in start order
        self._answering: set[asyncio.Task[None]] = set()
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
        committer = asyncio.create_task(self._commit_loop())
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
                log.info("closing connection to %s: %s", self.remote, self.error)
        finally:
            committer.cancel()
            await self._shutdown(writer)

    def submit(self, make: MakeRequest) -> asyncio.Future[Message]:
        """Send the request ``make(request_id)`` now; its response arrives in the future.

        The future raises RemoteError (the peer answered with an error) or
        ConnectionClosed (the connection closed first); it has no timeout of its own.
        """
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        if not self.ready:
            future.add_done_callback(_seen)
            future.set_exception(ConnectionClosed("the connection is not ready"))
            return future
        rid = self.session.next_request_id()
        self._pending[rid] = future
        future.add_done_callback(_seen)
        future.add_done_callback(lambda _: self._pending.pop(rid, None))
        self._enqueue(encode_frame(make(rid)))
        return future

    async def request(
        self, make: MakeRequest, *, expect: type[M], timeout: float | None = None
    ) -> M:
        """Send ``make(request_id)`` and return its response, an ``expect``.

        Raises:
            RemoteError: the peer answered with an error (``kind`` names it).
            RemoteProtocolError: it answered with something other than an ``expect``.
            RequestTimeout: no answer within the timeout.
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

    def spawn(self, coro: Coroutine[object, object, None]) -> None:
        """Run ``coro`` as a task owned by this connection (cancelled when it closes)."""
        self._own(asyncio.ensure_future(coro))

    def _own(self, task: asyncio.Task[None]) -> None:
        self._tasks[task] = None
        task.add_done_callback(lambda done: self._tasks.pop(done, None))

    # -- internals -----------------------------------------------------------------------

    def _enqueue(self, frame: bytes) -> None:
        if self._overflowed:
            return  # already being disconnected: drop, do not queue without bound
        try:
            self._outgoing.put_nowait(frame)
        except asyncio.QueueFull:
            log.warning("peer %s is not reading: disconnecting it", self.remote)
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
            await self._slots.acquire()  # backpressure: stop reading at the cap
            try:
                answered_later = await self._receive_one()
            except BaseException:
                self._slots.release()
                raise
            if not answered_later:
                self._slots.release()

    async def _receive_one(self) -> bool:
        """Read one frame; True if it is a request that will release its slot when answered."""
        frame = await self.transport.recv()
        try:
            events = self.session.receive(frame)
        finally:
            for out in self.session.take_outgoing():
                self._enqueue(out)
        later = False
        for event in events:
            if isinstance(event, Verified):
                self._verified(event)
            else:
                later = self._received(event) or later
        return later

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

    def _received(self, event: Received) -> bool:
        msg = event.message
        if isinstance(msg, SubscriptionUpdate):
            if self._on_update is None:
                raise RemoteProtocolError("this node holds no subscription with the peer")
            self.spawn(self._on_update(msg))
            return False
        if isinstance(msg, REQUESTS):
            if self._draining:
                rid = int(getattr(msg, "request_id", 0))  # every request carries one
                self.push(ErrorResponse(rid, "ConnectionClosed", "the node is shutting down"))
                return False
            if isinstance(msg, CommitRequest):
                self._commits.append(msg)
                self._commits_waiting.set()
                return True
            task = asyncio.ensure_future(self._answer(msg))
            self._own(task)
            self._answering.add(task)
            task.add_done_callback(self._answering.discard)
            return True
        answered = getattr(msg, "request_id", None)
        future = self._pending.get(answered) if isinstance(answered, int) else None
        if future is not None and not future.done():
            if isinstance(msg, ErrorResponse):
                future.set_exception(RemoteError(f"{msg.kind}: {msg.text}", kind=msg.kind))
            else:
                future.set_result(msg)
        else:
            log.debug("dropping a response to an unknown request %s", answered)
        return False

    async def _answer(self, msg: Message) -> None:
        rid = getattr(msg, "request_id", 0)
        try:
            response = await self._answers.handle(self, msg)
        except MyceliaError as exc:
            response = ErrorResponse(rid, type(exc).__name__, str(exc)[:4000])
        except Exception as exc:  # a bug must not leave the peer hanging
            log.exception("request %s from %s failed", rid, self.remote)
            response = ErrorResponse(rid, "InternalError", type(exc).__name__)
        finally:
            self._slots.release()
        self.push(response)

    async def _commit_loop(self) -> None:
        """Apply the peer's commits in arrival order, everything waiting at once."""
        while True:
            await self._commits_waiting.wait()
            self._commits_waiting.clear()
            batch, self._commits = self._commits, []
            if not batch:
                continue
            task = asyncio.ensure_future(self._commit(batch))
            self._answering.add(task)
            try:
                await asyncio.shield(task)
            finally:
                self._answering.discard(task)

    async def _commit(self, batch: list[CommitRequest]) -> None:
        try:
            responses = await self._answers.commit(self, batch)
        except Exception as exc:  # a bug must not leave the peer hanging
            log.exception("%d commits from %s failed", len(batch), self.remote)
            responses = [
                ErrorResponse(m.request_id, "InternalError", type(exc).__name__) for m in batch
            ]
        for response in responses:
            self._slots.release()
            self.push(response)

    async def _shutdown(self, writer: asyncio.Task[None]) -> None:
        self.session.close()
        self._closed.set()
        for future in list(self._pending.values()):
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
        self._answers.forget(self)
        if self.peer is not None and self._ready.is_set():
            log.info("peer %s disconnected (%s)", self.peer.node_id, self.error or "closed")


def _seen(future: asyncio.Future[Message]) -> None:
    """Mark a response's error as seen: its requester may have stopped waiting for it."""
    if not future.cancelled():
        future.exception()
