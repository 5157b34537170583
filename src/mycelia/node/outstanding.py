"""Our requests to a peer that wait for its answer: one future per request id.

A :class:`~mycelia.node.peer.PeerConnection` sends a request and registers its future here
(:class:`Outstanding`); what the peer sends back is matched to it by request id. A page of
a paged answer (:data:`~mycelia.proto.peering.PAGES`) is held until the final response,
and the requester gets that response with its pages joined to it; an
:class:`~mycelia.proto.peering.ErrorResponse` is raised as :func:`mycelia.errors.remote`
(the typed error, also a RemoteError).

Invariants:

- A request is forgotten, with its pages, as soon as its future is done, however it ends
  (answered, failed, or cancelled by a requester that stopped waiting); an answer to a
  request that is unknown or done is dropped.
- The pages held for one answer stay within :data:`MAX_ANSWER_BYTES`: a page past it
  raises PayloadTooLarge, which closes the connection.
- Every future ends: when the connection closes, :meth:`Outstanding.close` fails those
  still waiting with ConnectionClosed. A future's error is always marked as retrieved
  (:func:`seen`): its requester may have stopped waiting, and asyncio would log it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from mycelia.errors import ConnectionClosed, PayloadTooLarge, remote
from mycelia.proto.messages import Message
from mycelia.proto.peering import PAGES, ErrorResponse, joined

__all__ = ["MAX_ANSWER_BYTES", "Outstanding", "seen"]

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

    def add(self, rid: int, future: asyncio.Future[Message]) -> None:
        """Settle ``future`` with the answer to request ``rid`` (forgotten once it is done)."""
        self._pending[rid] = future
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
        pages.append(page)
        self._pages[request_id] = (pages, held + size)

    def _forget_request(self, request_id: int) -> None:
        self._pending.pop(request_id, None)
        self._pages.pop(request_id, None)


def seen(future: asyncio.Future[Message]) -> None:
    """Mark a response's error as seen: its requester may have stopped waiting for it."""
    if not future.cancelled():
        future.exception()
