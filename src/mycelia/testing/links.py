"""Simulated connections: the real peering code over faulty streams (ARCHITECTURE.md §12).

An ephemeral node reaches a durable one as a client reaches a server: through a real
:class:`~mycelia.node.client.Connection`, whose every dial opens a :class:`Stream`
between the two — each end a :class:`~mycelia.node.transport.Transport` driven by a real
:class:`~mycelia.node.peer.PeerConnection` (handshake, requests, pipelined commits,
pushed updates). A stream behaves as a TCP connection does, with the faults one meets:

- frames in one direction arrive in the order they were sent, each after a delay of
  1..``max_delay`` ticks drawn from the seeded generator (never before the frame sent
  before it);
- a stream can be **reset** (both ends closed at once, as a dropped connection is): each
  frame resets its stream with probability ``Faults.drop``;
- a frame can arrive **corrupted** (truncated, probability ``Faults.corrupt``): the
  receiving session refuses it and closes;
- a **partition** resets every stream across it, and dials across it are refused until it
  heals; a node that crashes loses its streams.

Invariant: given the seed and the same calls, the same frames arrive at the same virtual
times, and every open, frame and reset is recorded in the trace.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable
from typing import Final

from mycelia.errors import ConnectionClosed
from mycelia.testing.network import Faults, Network
from mycelia.testing.trace import Trace

__all__ = ["Links", "Stream"]

_CLOSED: Final = b""
"""Queued to an end's inbox when its stream closes (no real frame is empty)."""


class _End:
    """One end of a :class:`Stream` (a Transport)."""

    def __init__(self, stream: Stream, side: int) -> None:
        self._stream = stream
        self._side = side
        self.inbox: asyncio.Queue[bytes] = asyncio.Queue()

    @property
    def remote(self) -> str:
        """The node on the other side."""
        return f"sim/{self._stream.ends[1 - self._side]}#{self._stream.number}"

    async def send(self, frame: bytes) -> None:
        """Put one frame on the stream (ConnectionClosed once it is closed)."""
        if self._stream.closed:
            raise ConnectionClosed("the simulated connection is closed")
        self._stream.carry(self._side, bytes(frame))

    async def recv(self) -> bytes:
        """The next frame from the other end."""
        if self._stream.closed and self.inbox.empty():
            raise ConnectionClosed("the simulated connection is closed")
        frame = await self.inbox.get()
        if frame is _CLOSED or not frame:
            self.inbox.put_nowait(_CLOSED)  # later calls see the close too
            raise ConnectionClosed("the simulated connection was closed")
        return frame

    async def close(self) -> None:
        """Close the whole stream (both ends)."""
        self._stream.reset("closed")


class Stream:
    """One simulated connection between two nodes (see the module docstring)."""

    def __init__(self, links: Links, number: int, client: int, server: int) -> None:
        self._links = links
        self.number = number
        self.ends = (client, server)
        self.client = _End(self, 0)
        self.server = _End(self, 1)
        self.closed = False
        self._last = [0.0, 0.0]  # arrival time of the last frame each way
        self._on_the_way: tuple[deque[bytes], deque[bytes]] = (deque(), deque())
        """Frames sent each way and not arrived yet, oldest first."""

    def carry(self, side: int, frame: bytes) -> None:
        """Draw one frame's fate and schedule its arrival at the other end."""
        links = self._links
        faults, rng, now = links.network.faults, links.rng, links.now()
        src, dst = self.ends[side], self.ends[1 - side]
        if rng.random() < faults.drop:
            links.count("resets")
            self.reset("dropped")
            return
        if rng.random() < faults.corrupt:
            frame = frame[: rng.randrange(1, max(2, len(frame)))]
            links.count("corrupted frames")
        at = max(now + rng.randint(1, max(1, faults.max_delay)), self._last[side])
        self._last[side] = at
        links.trace.record("frame", now, self.number, src, dst, at, frame)
        links.count("frames")
        links.in_flight += 1
        self._on_the_way[side].append(frame)
        asyncio.get_running_loop().call_at(at, self._arrive, side)

    def _arrive(self, side: int) -> None:
        """One frame sent from ``side`` arrives: the oldest on its way. (Timers due at the
        same tick may fire in any order; the frames still arrive in the order sent.)"""
        self._links.in_flight -= 1
        frame = self._on_the_way[side].popleft()
        if not self.closed:
            (self.server if side == 0 else self.client).inbox.put_nowait(frame)

    def reset(self, reason: str) -> None:
        """Close both ends now; frames still on the way are lost."""
        if self.closed:
            return
        self.closed = True
        links = self._links
        links.trace.record("reset", links.now(), self.number, reason)
        links.streams.pop(self.number, None)
        self.client.inbox.put_nowait(_CLOSED)
        self.server.inbox.put_nowait(_CLOSED)


class Links:
    """Every simulated connection, the partition they obey, and their counters."""

    def __init__(self, network: Network, rng: random.Random, trace: Trace) -> None:
        self.network = network
        self.rng = rng
        self.trace = trace
        self.streams: dict[int, Stream] = {}
        self.in_flight = 0
        """Frames on their way."""
        self.counts: dict[str, int] = {}
        self._numbers = 0

    def now(self) -> float:
        """The virtual time."""
        return asyncio.get_running_loop().time()

    def count(self, what: str) -> None:
        """Add one to the counter ``what``."""
        self.counts[what] = self.counts.get(what, 0) + 1

    def open(self, client: int, server: int) -> Stream:
        """A new stream from ``client`` to ``server`` (ConnectionRefusedError across a
        partition)."""
        if self.network.cut(client, server):
            self.count("dials refused")
            raise ConnectionRefusedError(f"node {server} is cut off from node {client}")
        self._numbers += 1
        stream = Stream(self, self._numbers, client, server)
        self.streams[stream.number] = stream
        self.trace.record("open", self.now(), stream.number, client, server)
        self.count("connections")
        return stream

    def reset_where(self, doomed: Callable[[Stream], bool], reason: str) -> None:
        """Reset every open stream ``doomed`` picks (in the order they were opened)."""
        for stream in [s for _, s in sorted(self.streams.items()) if doomed(s)]:
            stream.reset(reason)

    def node_down(self, index: int) -> None:
        """A node crashed: its streams close."""
        self.reset_where(lambda s: index in s.ends, "crash")

    def partitioned(self) -> None:
        """The partition changed: streams across it close."""
        self.reset_where(lambda s: self.network.cut(*s.ends), "partition")

    def set_faults(self, faults: Faults) -> None:
        """Use other fault rates from now on (quiescence turns them off)."""
        self.network.faults = faults
