"""Transports: how frames travel between two nodes (ARCHITECTURE.md §7).

A :class:`Transport` sends and receives whole frames (one websocket binary message each).
Two implementations:

- :func:`memory_pair`: two connected in-process transports over bounded queues — a real
  transport, public, for tests and for embedding two nodes in one process;
- :class:`WebsocketTransport`: the ``websockets`` asyncio connection, binary frames only
  (a text frame is a protocol error), with the frame limit enforced by the library.

Every transport raises :class:`~mycelia.errors.ConnectionClosed` once closed, from either
side; websockets' own exceptions are translated here and chained. A peer that closed with
a reason naming an error code (``"10601 PolicyDenied: ..."``, see
:func:`close_reason`) raises that error, also a ConnectionClosed
(:func:`mycelia.errors.closed_by_peer`).

A transport may also let its frame limit be changed (:class:`Bounded`): a connection
allows only small frames until the handshake completes (ARCHITECTURE.md §7).
"""

from __future__ import annotations

import asyncio
import re
from typing import Final, Protocol, runtime_checkable

from websockets.asyncio.connection import Connection
from websockets.exceptions import ConnectionClosed as WsConnectionClosed

from mycelia.errors import ConnectionClosed, RemoteProtocolError, closed_by_peer, code_of

__all__ = [
    "Bounded",
    "MemoryTransport",
    "Transport",
    "WebsocketTransport",
    "allow_frames",
    "close_reason",
    "memory_pair",
]

_CLOSE: Final = object()
MAX_REASON: Final = 123
"""Bytes a websocket close reason may hold (RFC 6455 §5.5)."""
_CODED: Final = re.compile(r"(\d{1,9}) (.*)\Z", re.DOTALL)


class Transport(Protocol):
    """Whole frames, both ways."""

    @property
    def remote(self) -> str:
        """Who is on the other side (for logs)."""
        ...

    async def send(self, frame: bytes) -> None:
        """Send one frame; raises ConnectionClosed if closed."""
        ...

    async def recv(self) -> bytes:
        """The next frame; raises ConnectionClosed when the connection ends."""
        ...

    async def close(self) -> None:
        """Close both directions (idempotent)."""
        ...


@runtime_checkable
class Bounded(Protocol):
    """A transport whose largest incoming frame can be changed while it is open."""

    def allow_frames(self, max_bytes: int) -> None:
        """Refuse incoming frames over ``max_bytes`` from now on (before reading them)."""
        ...


def allow_frames(transport: object, max_bytes: int) -> None:
    """Tell ``transport`` its frame limit, if it can take one (the session checks anyway)."""
    if isinstance(transport, Bounded):
        transport.allow_frames(max_bytes)


def close_reason(error: BaseException) -> str:
    """A websocket close reason naming ``error`` by its code: ``"<code> <Class>: <text>"``,
    cut to the 123 bytes a reason may hold."""
    text = f"{code_of(error)} {type(error).__name__}: {error}"
    return text.encode()[:MAX_REASON].decode("utf-8", "ignore")


def _closed(exc: WsConnectionClosed) -> ConnectionClosed:
    """The error a websocket close means: the peer's typed error when its reason names a
    code (see :func:`close_reason`), else a plain ConnectionClosed."""
    received = exc.rcvd
    if received is not None and received.code != 1000:
        coded = _CODED.match(received.reason)
        if coded is not None:
            kind_and_text = coded.group(2)
            text = kind_and_text.split(": ", 1)[-1]
            return closed_by_peer(int(coded.group(1)), text)
    return ConnectionClosed(f"websocket closed: {exc}")


class MemoryTransport:
    """One end of an in-process pair; see :func:`memory_pair`."""

    def __init__(self, inbox: asyncio.Queue[object], outbox: asyncio.Queue[object], name: str):
        self._inbox = inbox
        self._outbox = outbox
        self._name = name
        self._closed = False

    @property
    def remote(self) -> str:
        """The pair's name."""
        return self._name

    async def send(self, frame: bytes) -> None:
        """Queue a frame for the other end (waits while its queue is full)."""
        if self._closed:
            raise ConnectionClosed("this transport is closed")
        await self._outbox.put(bytes(frame))

    async def recv(self) -> bytes:
        """The next frame from the other end."""
        if self._closed:
            raise ConnectionClosed("this transport is closed")
        item = await self._inbox.get()
        if item is _CLOSE:
            self._closed = True
            self._inbox.put_nowait(_CLOSE)  # later recv calls see the close too
            raise ConnectionClosed("the other end closed")
        assert isinstance(item, bytes)
        return item

    async def close(self) -> None:
        """Close both ends."""
        if self._closed:
            return
        self._closed = True
        for queue in (self._outbox, self._inbox):
            while queue.full():
                queue.get_nowait()
            queue.put_nowait(_CLOSE)


def memory_pair(
    *, capacity: int = 1024, name: str = "memory"
) -> tuple[MemoryTransport, MemoryTransport]:
    """Two connected transports; frames sent on one arrive on the other, in order."""
    a: asyncio.Queue[object] = asyncio.Queue(capacity)
    b: asyncio.Queue[object] = asyncio.Queue(capacity)
    return MemoryTransport(a, b, f"{name}/a"), MemoryTransport(b, a, f"{name}/b")


class WebsocketTransport:
    """A ``websockets`` asyncio connection (client or server side)."""

    def __init__(self, connection: Connection) -> None:
        self._ws = connection

    def allow_frames(self, max_bytes: int) -> None:
        """Refuse frames over ``max_bytes`` from now on: websockets checks a frame's length
        in its header, so a bigger one is refused (close 1009) before it is read."""
        self._ws.protocol.max_message_size = max_bytes

    @property
    def remote(self) -> str:
        """The peer's address."""
        address = self._ws.remote_address
        return f"{address[0]}:{address[1]}" if address else "?"

    async def send(self, frame: bytes) -> None:
        """Send one binary message."""
        try:
            await self._ws.send(frame)
        except WsConnectionClosed as exc:
            raise _closed(exc) from exc

    async def recv(self) -> bytes:
        """The next binary message (a text message is a protocol error)."""
        try:
            data = await self._ws.recv()
        except WsConnectionClosed as exc:
            raise _closed(exc) from exc
        if isinstance(data, str):
            raise RemoteProtocolError("text frames are not part of this protocol")
        return data

    async def close(self) -> None:
        """Close the websocket."""
        await self._ws.close()
