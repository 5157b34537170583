"""Serving a node to peers in the same process, over memory transports (ARCHITECTURE.md §7).

``InProcessServer(node)`` is ``mycelia.serve`` without sockets: every client it connects
gets a real :class:`~mycelia.node.peer.PeerConnection` on each side of a
:func:`~mycelia.node.transport.memory_pair`, so the whole protocol runs — handshake,
requests, pipelined commits, pushed updates — with no I/O and no port. For embedding two
nodes in one process and for tests that must be deterministic. A server that is
:meth:`InProcessServer.stop`-ped refuses dials (as a stopped process would) until it is
:meth:`InProcessServer.start`-ed again.
"""

from __future__ import annotations

import asyncio
import random
from types import TracebackType
from typing import TYPE_CHECKING

from mycelia.node.client import Connection
from mycelia.node.peer import PeerConnection
from mycelia.node.transport import Transport, memory_pair

if TYPE_CHECKING:
    from mycelia.node.node import Node

__all__ = ["InProcessServer"]


class InProcessServer:
    """One node served to in-process clients; an async context manager."""

    def __init__(
        self,
        node: Node,
        *,
        request_timeout: float = 30.0,
        handshake_timeout: float = 10.0,
        outgoing_frames: int = 4096,
        capacity: int = 1024,
    ) -> None:
        self.node = node
        self._request_timeout = request_timeout
        self._handshake_timeout = handshake_timeout
        self._outgoing_frames = outgoing_frames
        self._capacity = capacity
        self._serving = True
        self._peers: dict[PeerConnection, asyncio.Task[None]] = {}
        self._dials = 0

    @property
    def connections(self) -> list[PeerConnection]:
        """The connections open now."""
        return list(self._peers)

    def connect(
        self,
        client: Node,
        *,
        token: bytes | None = None,
        min_backoff: float = 0.01,
        max_backoff: float = 1.0,
        request_timeout: float = 30.0,
        rng: random.Random | None = None,
    ) -> Connection:
        """Keep ``client`` connected to this server (as ``mycelia.connect`` does)."""
        connection = client.attach(
            self._dial,
            token=token,
            min_backoff=min_backoff,
            max_backoff=max_backoff,
            request_timeout=request_timeout,
            rng=rng or random.Random(f"mycelia/inprocess/{self._dials}"),
        )
        connection.start()
        return connection

    async def _dial(self) -> Transport:
        if not self._serving:
            raise ConnectionRefusedError("the in-process server is stopped")
        self._dials += 1
        near, far = memory_pair(capacity=self._capacity, name=f"inprocess/{self._dials}")
        peer = self.node.accept(
            far,
            request_timeout=self._request_timeout,
            handshake_timeout=self._handshake_timeout,
            outgoing_frames=self._outgoing_frames,
        )
        task = asyncio.ensure_future(peer.run())
        self._peers[peer] = task
        task.add_done_callback(lambda _: self._peers.pop(peer, None))
        return near

    async def drop(self) -> None:
        """Close every open connection (the clients redial)."""
        peers = list(self._peers.items())
        for peer, _ in peers:
            await peer.close()
        await asyncio.gather(*(task for _, task in peers), return_exceptions=True)

    async def stop(self) -> None:
        """Refuse new dials and close every connection (a stopped server)."""
        self._serving = False
        await self.drop()

    def start(self) -> None:
        """Take dials again."""
        self._serving = True

    async def close(self) -> None:
        """Stop for good (the node itself stays open)."""
        await self.stop()

    async def __aenter__(self) -> InProcessServer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
