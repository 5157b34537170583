"""Starvation (issue 16, defects 5 and 7): attackers running at once against a real
``mycelia serve`` do not keep a well-behaved client from being served.

At once, from a process of their own (``tests/hostile/attack.py``): 4 connections in a
loop, each sending a 4 MB decode bomb before the handshake (defect 5), and 16 connections
each asking, again and again, a heavy query (200 ORs over :data:`ALBUMS` albums: a
million tests of work, within the query cost budget) (defect 7). Meanwhile a new client
connects, commits and reads, each within :data:`WITHIN`. Before issue 16 a decode bomb
held the event loop for about 2 s, and 16 heavy queries kept new clients from completing
the handshake for about 50 s. Now a bomb is refused from its frame header, and a heavy
query runs one at a time per connection and one at a time per node, yielding to the
event loop every 2 ms (``mycelia.node.deltas``).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import mycelia
from mycelia import Model, Node
from mycelia.storage import MemoryStorage
from tests.hostile.serving import Served, start

ALBUMS = 5000
WITHIN = 0.5
ROUNDS = 5


class Album(Model, collection="albums"):
    name: str
    year: int = 0


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    server = await start(tmp_path / "data")
    yield server
    await server.stop()


class Attackers:
    """``tests.hostile.attack`` in a child process, and the rounds it reported."""

    def __init__(self, process: asyncio.subprocess.Process, bombs: int, heavy: int) -> None:
        self.process = process
        self.bombs = bombs
        self.heavy_answers = heavy
        self._heard = asyncio.Event()
        self._reading = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, url: str) -> Attackers:
        """Start the attack; return once all of it is under way."""
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.hostile.attack", url, stdout=asyncio.subprocess.PIPE
        )
        assert process.stdout is not None
        async with asyncio.timeout(180):
            line = await process.stdout.readline()
        running, _, bombs, _, heavy = line.split()
        assert running == b"running", line
        return cls(process, int(bombs), int(heavy))

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for line in self.process.stdout:
            _, bombs, _, heavy = line.split()
            self.bombs, self.heavy_answers = int(bombs), int(heavy)
            self._heard.set()

    async def wait_heavy(self, count: int) -> None:
        """Wait until the attackers had ``count`` heavy answers in all."""
        async with asyncio.timeout(120):
            while self.heavy_answers < count:
                self._heard.clear()
                await self._heard.wait()

    async def stop(self) -> int | None:
        """Stop the attack; its exit code if it ended by itself (it must not)."""
        ended = self.process.returncode
        if ended is None:
            self.process.terminate()
        await self.process.wait()
        await self._reading
        return ended


async def _seed(url: str) -> None:
    writer = await Node.open(MemoryStorage(), durable=False)
    await mycelia.connect(writer, url)
    await writer.wait_ready(timeout=30)
    for first in range(0, ALBUMS, 500):
        async with writer.context().transaction() as trx:
            for i in range(first, first + 500):
                trx.create(Album, name=f"a{i}", year=i)
    await writer.close()


async def _one_client(url: str, n: int) -> tuple[float, float, float]:
    """A new client's connect, commit and read times, in seconds."""
    started = time.monotonic()
    node = await Node.open(MemoryStorage(), durable=False)
    await mycelia.connect(node, url)
    await node.wait_ready(timeout=30)
    connected = time.monotonic()
    async with node.context().transaction() as trx:
        trx.create(Album, name=f"probe{n}", year=-n)
    committed = time.monotonic()
    rows = await node.context().fetch(Album, f"name = 'probe{n}'")
    read = time.monotonic()
    assert [r.year for r in rows] == [-n]
    await node.close()
    return connected - started, committed - connected, read - committed


async def test_a_client_connects_commits_and_reads_in_time_while_attackers_run(
    served: Served,
) -> None:
    await _seed(served.url)
    attack = await Attackers.start(served.url)
    try:
        cpu, started = served.cpu(), time.monotonic()
        bombs, heavy = attack.bombs, attack.heavy_answers
        timings = [await _one_client(served.url, n) for n in range(ROUNDS)]
        busy, wall = served.cpu() - cpu, time.monotonic() - started
        bombs, heavy = attack.bombs - bombs, attack.heavy_answers - heavy
        await attack.wait_heavy(attack.heavy_answers + 1)  # heavy queries are served too
    finally:
        ended = await attack.stop()
    assert ended is None  # the attack ran all along
    slowest = [max(t[i] for t in timings) for i in range(3)]
    print(
        f"slowest connect {slowest[0] * 1000:.0f} ms, commit {slowest[1] * 1000:.0f} ms, "
        f"read {slowest[2] * 1000:.0f} ms; meanwhile ({wall:.1f} s) the server spent {busy:.1f} s "
        f"of CPU, answered {heavy} heavy queries and refused {bombs} bombs"
    )
    assert bombs >= 1  # the attack went on while the client was served
    assert slowest[0] < WITHIN
    assert slowest[1] < WITHIN
    assert slowest[2] < WITHIN
