"""A metering transport: what the server can measure on the wire, without the session.

:class:`MeteredTransport` wraps the :class:`~mycelia.node.transport.Transport` of one
served connection and reports to :class:`~mycelia.node.metrics.Metrics`:

- every frame's size, both ways;
- per request, the time from its frame arriving to its response leaving (by request
  class, keyed by request id);
- every error response, by error class, and to ``on_refusal`` (the server logs it).

Invariants:

- It never changes, drops or reorders a frame, and never raises for a frame it cannot
  read: it only peeks at the frame's tag and request id (ARCHITECTURE.md §7: a frame is an
  array ``[tag, request_id, ...]`` for requests and responses); only an error response —
  small, rare — is decoded whole. The session still validates everything.
- Memory stays bounded: at most :data:`TIMED_REQUESTS` requests are timed at once (the
  peer may have far fewer in flight; a request beyond the bound is simply not timed).
- ``close`` says why when the transport can (:class:`Explaining`): the error that ended
  the connection (``why()``) becomes a websocket close code (1002 a protocol violation,
  1008 a policy or budget one, 1009 a frame or field too large, 1011 a bug here) and a
  reason naming the error by its code (:func:`~mycelia.node.transport.close_reason`),
  which the peer raises as that error.
- It forwards a frame limit to the transport it wraps (:class:`~mycelia.node.transport.Bounded`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final, Protocol, runtime_checkable

from mycelia.errors import (
    ConnectionClosed,
    DecodeError,
    MyceliaError,
    Overloaded,
    PayloadTooLarge,
    PolicyDenied,
)
from mycelia.node.metrics import Metrics
from mycelia.node.transport import Transport, allow_frames, close_reason
from mycelia.proto.messages import decode_frame, message_types, peek
from mycelia.proto.peering import REQUESTS, Ack, DeltasResponse, ErrorResponse, EventsResponse

__all__ = ["Explaining", "MeteredTransport", "close_code"]

log = logging.getLogger(__name__)

TIMED_REQUESTS: Final = 1024
REQUEST_TAGS: Final = frozenset(cls.TAG for cls in REQUESTS)
RESPONSE_TAGS: Final = frozenset(
    cls.TAG for cls in (ErrorResponse, Ack, EventsResponse, DeltasResponse)
)
NAMES: Final = {tag: cls.__name__ for tag, cls in message_types().items()}

Refusal = Callable[[str, str, str], None]
"""``on_refusal(request, error_kind, text)``."""


@runtime_checkable
class Explaining(Protocol):
    """A transport that can close with a websocket close code and reason."""

    async def close_because(self, code: int, reason: str) -> None:
        """Close both directions, telling the peer ``code`` and ``reason``."""
        ...


def close_code(error: BaseException | None) -> tuple[int, str]:
    """The websocket close code and reason (at most 123 bytes) that explain ``error``."""
    if error is None:
        return 1000, ""
    if isinstance(error, ConnectionClosed):
        return 1000, str(error).encode()[:123].decode("utf-8", "ignore")
    if isinstance(error, PayloadTooLarge):
        code = 1009  # message too big
    elif isinstance(error, PolicyDenied | Overloaded):
        code = 1008  # policy violation (a refusal, or a budget the peer overran)
    elif isinstance(error, MyceliaError | TimeoutError):
        code = 1002  # protocol error
    else:
        code = 1011  # internal error
    return code, close_reason(error)


class MeteredTransport:
    """Wraps a served connection's transport; see the module docstring."""

    def __init__(
        self,
        inner: Transport,
        metrics: Metrics,
        *,
        on_refusal: Refusal,
        why: Callable[[], BaseException | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._inner = inner
        self._metrics = metrics
        self._on_refusal = on_refusal
        self._why = why
        self._clock = clock
        self._started: dict[int, tuple[str, float]] = {}

    @property
    def remote(self) -> str:
        """The peer's address."""
        return self._inner.remote

    async def recv(self) -> bytes:
        """The next frame (counted; a request starts its timer)."""
        frame = await self._inner.recv()
        self._metrics.received(len(frame))
        tag, rid = peek(frame)
        if tag in REQUEST_TAGS and rid is not None and len(self._started) < TIMED_REQUESTS:
            self._started[rid] = (NAMES[tag], self._clock())
        return frame

    async def send(self, frame: bytes) -> None:
        """Send one frame (counted; a response stops its request's timer)."""
        tag, rid = peek(frame)
        if tag in RESPONSE_TAGS and rid is not None:
            started = self._started.pop(rid, None)
            request = "unknown" if started is None else started[0]
            if started is not None:
                self._metrics.observe_request(request, self._clock() - started[1])
            if tag == ErrorResponse.TAG:
                self._refusal(request, frame)
        await self._inner.send(frame)
        self._metrics.sent(len(frame))

    def _refusal(self, request: str, frame: bytes) -> None:
        try:
            response = decode_frame(frame)
        except DecodeError:  # we wrote it, so this is a bug; never break the connection
            log.exception("an error response this node sent does not decode")
            return
        if isinstance(response, ErrorResponse):
            self._metrics.refused(response.kind)
            self._on_refusal(request, response.kind, response.text)

    def allow_frames(self, max_bytes: int) -> None:
        """Pass a frame limit on to the wrapped transport (if it takes one)."""
        allow_frames(self._inner, max_bytes)

    async def close(self) -> None:
        """Close, explaining why to the peer when the transport can."""
        if isinstance(self._inner, Explaining):
            await self._inner.close_because(*close_code(self._why()))
        else:
            await self._inner.close()
