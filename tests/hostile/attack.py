"""The attackers of ``test_starvation``, run as their own process: ``python -m
tests.hostile.attack URL``, stopped with SIGTERM.

:data:`BOMBERS` connections in a loop, each sending a 4 MB decode bomb before the
handshake, and :data:`HEAVY` connections each asking a heavy query again and again. It
prints ``running bombs B heavy H`` (the rounds so far) once every attacker has had one
round, then ``bombs B heavy H`` after each further round. In a process of their own the
attackers do not slow down the client being measured.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable

import pytest
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed as WsClosed

from mycelia.proto.messages import Message
from mycelia.proto.peering import PAGES, DeltasResponse, FetchRequest
from tests.hostile.serving import RawPeer, decode_bomb

MIB = 1024 * 1024
BOMBERS = 4
HEAVY = 16
HEAVY_QUERY = " OR ".join(f"name = 'x{i}'" for i in range(200))
"""200 tests a row: over 5,000 albums a million tests, within the query cost budget."""
PAGE_TYPES = tuple(PAGES.values())


def is_answer(rid: int) -> Callable[[Message], bool]:
    """Whether a frame is the final answer to request ``rid`` (not one of its pages)."""
    return lambda m: getattr(m, "request_id", None) == rid and not isinstance(m, PAGE_TYPES)


class Attack:
    """The attackers' loops, counting their rounds."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.bombs = 0
        self.heavy_answers = 0
        self._bombed: set[int] = set()
        self._answered: set[int] = set()
        self._running = False

    async def run(self) -> None:
        peers = [await RawPeer.open(self.url) for _ in range(HEAVY)]
        await asyncio.gather(
            *(self._bomber(i) for i in range(BOMBERS)),
            *(self._heavy(i, peer) for i, peer in enumerate(peers)),
        )

    def _report(self) -> None:
        counts = f"bombs {self.bombs} heavy {self.heavy_answers}"
        if self._running:
            print(counts, flush=True)
        elif len(self._bombed) == BOMBERS and len(self._answered) == HEAVY:
            self._running = True
            print("running", counts, flush=True)

    async def _bomber(self, n: int) -> None:
        bomb = decode_bomb(4 * MIB)
        while True:
            ws = await ws_connect(self.url, max_size=None, compression=None)
            with pytest.raises(WsClosed):
                await _send_and_drain(ws, bomb)
            self.bombs += 1
            self._bombed.add(n)
            self._report()

    async def _heavy(self, n: int, peer: RawPeer) -> None:
        while True:
            rid = peer.rid()
            await peer.send(FetchRequest(rid, "albums", HEAVY_QUERY, (), ()))
            seen = await peer.until(is_answer(rid), timeout=300)
            assert isinstance(seen[-1], DeltasResponse), seen[-1]
            self.heavy_answers += 1
            self._answered.add(n)
            self._report()


async def _send_and_drain(ws: ClientConnection, frame: bytes) -> None:
    await ws.send(frame)
    async with asyncio.timeout(30):
        while True:
            await ws.recv()


if __name__ == "__main__":
    asyncio.run(Attack(sys.argv[1]).run())
