"""What bounds a served websocket connection before and beside its session (ARCHITECTURE.md
§7): how many connections a server holds, and how big and how slow their frames may be.

Bounds (each a documented default, each refused with a typed error):

- at most ``max_connections`` connections (:data:`MAX_CONNECTIONS`), and at most
  ``max_connections_per_ip`` from one address (off by default): one more is closed with
  1013 and ``Overloaded`` as its reason;
- a peer's first two frames (its Presence and its proof) may be at most
  ``limits.max_handshake_bytes`` each: a connection holding more of one is closed (1009)
  as its bytes arrive, before anything decodes them; later frames, the frame limit
  (websockets refuses a bigger frame from its header). The socket counts frames rather
  than wait for the session's verdict because a client sends its first request right
  behind its proof, often in the same packet (the session refuses anything but a proof
  until the proof verifies);
- a message that started arriving must finish within ``unfinished_timeout``
  (:data:`UNFINISHED_TIMEOUT`), or the connection is closed (1008); fragmented messages
  are not part of the protocol (1002);
- all connections together hold at most ``partial_bytes`` (:data:`PARTIAL_BYTES`) of
  messages that have not finished arriving: a connection that would go beyond stops
  being read (its socket fills up) until others finish or are cut off;
- websockets queues at most :data:`~mycelia.node.server.QUEUED_FRAMES` whole frames per
  connection that the session has not taken yet (then it stops reading the socket); the
  session's own budgets (:mod:`mycelia.node.budget`) do the rest.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Final

from websockets.asyncio.server import ServerConnection
from websockets.frames import CONT, DATA_OPCODES, Frame
from websockets.protocol import State

from mycelia.errors import Overloaded
from mycelia.node.transport import close_reason

__all__ = [
    "HANDSHAKE_FRAMES",
    "MAX_CONNECTIONS",
    "PARTIAL_BYTES",
    "UNFINISHED_TIMEOUT",
    "Admission",
    "BoundedConnection",
    "Partial",
    "connection_class",
]

log = logging.getLogger(__name__)

MAX_CONNECTIONS: Final = 1024
"""Connections one server holds at once (handshaking or ready)."""
UNFINISHED_TIMEOUT: Final = 30.0
"""Seconds a message may take to arrive once its first bytes did."""
PARTIAL_BYTES: Final = 32 * 1024 * 1024
"""Bytes of unfinished messages all of a server's connections may hold together."""
HANDSHAKE_FRAMES: Final = 2
"""Frames a dialer sends before its requests: its Presence and its proof."""


class Partial:
    """The bytes of unfinished messages a server's connections hold, together: a
    connection that would take the total past the budget stops being read until it is
    back under (first paused, first resumed)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.total = 0
        self._held: dict[BoundedConnection, int] = {}
        self._paused: deque[BoundedConnection] = deque()

    def update(self, connection: BoundedConnection, held: int) -> None:
        """``connection`` now holds ``held`` bytes of an unfinished message."""
        before = self._held.pop(connection, 0)
        if held:
            self._held[connection] = held
        self.total += held - before
        if held > before and self.total > self.budget and connection not in self._paused:
            self._paused.append(connection)
            connection.transport.pause_reading()
        elif held < before:
            self._resume()

    def forget(self, connection: BoundedConnection) -> None:
        """``connection`` closed."""
        self.update(connection, 0)
        if connection in self._paused:
            self._paused.remove(connection)
        self._resume()

    def _resume(self) -> None:
        while self._paused and self.total <= self.budget // 2:
            connection = self._paused.popleft()
            connection.resume()


class BoundedConnection(ServerConnection):
    """A websockets server connection that bounds unfinished messages (see the module):
    how long one may take, and how many bytes all of them hold together (:class:`Partial`)."""

    partial: Partial
    unfinished_timeout: float
    handshake_bytes: int

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._since: asyncio.TimerHandle | None = None
        self._frames = 0
        """Data frames received so far (the first HANDSHAKE_FRAMES are small)."""

    def data_received(self, data: bytes) -> None:
        """Read as websockets does, then account for the unfinished message."""
        super().data_received(data)
        self._account()

    def process_event(self, event: object) -> None:
        """A fragmented message is refused (a frame is one whole message here)."""
        if isinstance(event, Frame) and (event.opcode is CONT or not event.fin):
            self._fail(1002, "fragmented messages are not part of this protocol")
            return
        if isinstance(event, Frame) and event.opcode in DATA_OPCODES:
            self._frames += 1
        super().process_event(event)  # type: ignore[arg-type]

    def connection_lost(self, exc: Exception | None) -> None:
        """Let go of what it held."""
        self._stop_timer()
        self.partial.forget(self)
        super().connection_lost(exc)

    def resume(self) -> None:
        """Read again (unless websockets itself paused reading: its queue is full)."""
        if not self.recv_messages.paused and not self.transport.is_closing():
            self.transport.resume_reading()

    def _account(self) -> None:
        held = len(self.protocol.reader.buffer) if self.protocol.state is State.OPEN else 0
        if self._frames < HANDSHAKE_FRAMES and held > self.handshake_bytes + 16:  # (a header)
            self._fail(1009, f"a handshake frame over {self.handshake_bytes} bytes")
            return
        self.partial.update(self, held)
        if not held:
            self._stop_timer()
        elif self._since is None:
            self._since = self.loop.call_later(self.unfinished_timeout, self._unfinished)

    def _stop_timer(self) -> None:
        if self._since is not None:
            self._since.cancel()
            self._since = None

    def _unfinished(self) -> None:
        self._since = None
        error = Overloaded(f"a message took longer than {self.unfinished_timeout:g} s to arrive")
        log.warning("closing the connection from %s: %s", self.remote_address, error)
        self._fail(1008, close_reason(error))

    def _fail(self, code: int, reason: str) -> None:
        if self.protocol.state is State.OPEN:
            self.protocol.fail(code, reason)
            self.send_data()
        self.transport.close()
        self.partial.forget(self)


def connection_class(
    partial: Partial, unfinished_timeout: float, handshake_bytes: int
) -> type[BoundedConnection]:
    settings = {
        "partial": partial,
        "unfinished_timeout": unfinished_timeout,
        "handshake_bytes": handshake_bytes,
    }
    return type("BoundedConnection", (BoundedConnection,), settings)


class Admission:
    """How many connections a server holds, in all and per address (see the module)."""

    def __init__(self, *, total: int, per_ip: int | None) -> None:
        self._total = total
        self._per_ip = per_ip
        self._count = 0
        self._by_ip: dict[str, int] = {}

    def enter(self, address: str) -> None:
        """Count one more connection from ``address``; raises Overloaded beyond a bound."""
        if self._count >= self._total:
            raise Overloaded(f"this server holds {self._total} connections already")
        held = self._by_ip.get(address, 0)
        if self._per_ip is not None and held >= self._per_ip:
            raise Overloaded(f"this server holds {self._per_ip} connections from {address}")
        self._count += 1
        self._by_ip[address] = held + 1

    def leave(self, address: str) -> None:
        """One connection from ``address`` ended."""
        self._count -= 1
        held = self._by_ip.pop(address, 1) - 1
        if held:
            self._by_ip[address] = held
