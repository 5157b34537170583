"""Our requests to a peer that wait for its answer: one future per request id.

A :class:`~mycelia.node.peer.PeerConnection` sends a request and registers its future here
(:class:`Outstanding`); what the peer sends back is matched to it by request id. A page of
a paged answer (:data:`~mycelia.proto.peering.PAGES`) is held until the final response,
and the requester gets that response with its pages joined to it — unless it asked to
take the pages as they arrive (:class:`Streamed`: a fresh client applies a large
subscription answer page by page while the peer is still building the rest). An
:class:`~mycelia.proto.peering.ErrorResponse` is raised as :func:`mycelia.errors.remote`
(the typed error, also a RemoteError).

Invariants:

- A request is forgotten, with its pages, as soon as its future is done, however it ends
  (answered, failed, or cancelled by a requester that stopped waiting); an answer to a
  request that is unknown or done is dropped.
- The pages of one answer stay within :data:`MAX_ANSWER_BYTES`, whether held here or
  handed over as they arrive: a page past it raises PayloadTooLarge, which closes the
  connection.
- Every future ends: when the connection closes, :meth:`Outstanding.close` fails those
  still waiting with ConnectionClosed. A future's error is always marked as retrieved
  (:func:`seen`): its requester may have stopped waiting, and asyncio would log it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Final

from mycelia.errors import ConnectionClosed, PayloadTooLarge, RequestTimeout, remote
from mycelia.proto.messages import Message
from mycelia.proto.peering import PAGES, ErrorResponse, joined

__all__ = ["MAX_ANSWER_BYTES", "Outstanding", "Streamed", "seen"]

log = logging.getLogger("mycelia.node.peer")
"""A connection logs under one name, its driver's (:mod:`mycelia.node.peer`)."""

MAX_ANSWER_BYTES: Final = 256 * 1024 * 1024
"""Bytes of pages this side holds for one answer before it refuses the peer's answer."""
PAGE_TYPES: Final = tuple(PAGES.values())


class Outstanding:
    """The requests of one connection waiting for the peer's answer."""

    def __init__(self) -> None:
        self._pending: dict[int, asyncio.Future[Message]] = {}
        self._pages: dict[int, tuple[list[Message], int]] = {}
        """Pages received for a pending request, and their bytes."""
        self._sinks: dict[int, Callable[[Message], None]] = {}
        """Where the pages of a streamed request go as they arrive (see :class:`Streamed`)."""

    def add(
        self,
        rid: int,
        future: asyncio.Future[Message],
        *,
        pages: Callable[[Message], None] | None = None,
    ) -> None:
        """Settle ``future`` with the answer to request ``rid`` (forgotten once it is done);
        with ``pages``, hand it each page as it arrives instead (the future then gets the
        final response alone)."""
        self._pending[rid] = future
        if pages is not None:
            self._sinks[rid] = pages
        future.add_done_callback(seen)
        future.add_done_callback(lambda _: self._forget_request(rid))

    def answer(self, msg: Message, size: int) -> None:
        """Take ``msg``, a response of ``size`` bytes from the peer, for its request.

        Raises PayloadTooLarge if it is a page that takes its answer past
        :data:`MAX_ANSWER_BYTES`.
        """
        answered = getattr(msg, "request_id", None)
        future = self._pending.get(answered) if isinstance(answered, int) else None
        if future is None or future.done():
            log.debug("dropping a response to an unknown request %s", answered)
        elif isinstance(msg, PAGE_TYPES):
            self._page(answered, msg, size)  # type: ignore[arg-type]
        elif isinstance(msg, ErrorResponse):
            future.set_exception(remote(msg.code, msg.text))
        else:
            pages, _ = self._pages.pop(answered, ([], 0))  # type: ignore[arg-type]
            future.set_result(joined(pages, msg))

    def close(self, ended: ConnectionClosed | None) -> None:
        """Fail every request still waiting with ``ended`` (by default a ConnectionClosed
        of its own) and drop the pages held."""
        for future in list(self._pending.values()):
            if not future.done():
                future.set_exception(ended or ConnectionClosed("the connection closed"))
        self._pages.clear()

    def _page(self, request_id: int, page: Message, size: int) -> None:
        pages, held = self._pages.get(request_id, ([], 0))
        if held + size > MAX_ANSWER_BYTES:
            raise PayloadTooLarge(f"the peer's answer is over {MAX_ANSWER_BYTES} bytes")
        sink = self._sinks.get(request_id)
        if sink is None:
            pages.append(page)
        else:
            sink(page)  # counted, not held
        self._pages[request_id] = (pages, held + size)

    def _forget_request(self, request_id: int) -> None:
        self._pending.pop(request_id, None)
        self._pages.pop(request_id, None)
        self._sinks.pop(request_id, None)


class Streamed:
    """One request's answer taken page by page as it arrives, then its final response.

    Use it as ``async with stream as parts: async for part in parts: ...``. The parts are
    each page in order and then the final response; iterating raises what the request
    raised (a RemoteError for the peer's refusal, ConnectionClosed), or RequestTimeout
    when ``timeout`` seconds pass with nothing arriving. The time the requester spends on
    a part does not count: a large answer applied as it comes is not cut short. Leaving
    the block cancels the request, however it is left (the rest of its answer is then
    dropped as it comes).
    """

    def __init__(self, timeout: float) -> None:
        self.future: asyncio.Future[Message] | None = None
        self._timeout = timeout
        self._pages: deque[Message] = deque()
        self._arrived = asyncio.Event()

    def waits_for(self, future: asyncio.Future[Message]) -> None:
        """Take ``future`` as the request's final response (set once, right after sending)."""
        self.future = future
        future.add_done_callback(lambda _: self._arrived.set())

    def responded(self) -> bool:
        """Whether the final response (or the request's failure) has arrived, whatever the
        requester has taken of the answer so far."""
        return self.future is not None and self.future.done()

    def page(self, page: Message) -> None:
        """Take a page of the answer (:meth:`Outstanding.add`'s ``pages``)."""
        self._pages.append(page)
        self._arrived.set()

    async def __aenter__(self) -> AsyncIterator[Message]:
        assert self.future is not None, "waits_for() sets the request's future first"
        return self._parts(self.future)

    async def __aexit__(self, *_: object) -> None:
        if self.future is not None:
            self.future.cancel()

    async def _parts(self, future: asyncio.Future[Message]) -> AsyncIterator[Message]:
        while True:
            while self._pages:
                yield self._pages.popleft()
            if future.done():
                yield future.result()
                return
            self._arrived.clear()
            try:
                async with asyncio.timeout(self._timeout):
                    await self._arrived.wait()
            except TimeoutError as exc:
                raise RequestTimeout(f"no answer in {self._timeout:g} s") from exc


def seen(future: asyncio.Future[Message]) -> None:
    """Mark a response's error as seen: its requester may have stopped waiting for it."""
    if not future.cancelled():
        future.exception()
