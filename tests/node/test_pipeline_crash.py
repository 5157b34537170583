"""A thousand pipelined commits, and a ``kill -9`` of the server in the middle of them.

A real ``mycelia serve`` process on LMDB takes the commits of one client, made on one
entity with ``wait="local"`` (all in flight at once). It is killed with SIGKILL once some
are confirmed, and restarted on the same data and port. No confirmed commit may be lost;
the unconfirmed ones are pushed again by the client when it reconnects, in order, and all
end up confirmed, as one chain.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

import pytest

import mycelia
from mycelia import Model, Node
from mycelia.node import Transaction
from mycelia.storage import LmdbStorage, MemoryStorage

pytestmark = pytest.mark.crash

COMMITS = 1000


class Counter(Model, collection="counters"):
    n: int = 0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _serve(data: Path, port: int) -> asyncio.subprocess.Process:
    with (data.parent / "server.log").open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "mycelia.cli", "serve", "--data", str(data),
            "--port", str(port), stdout=asyncio.subprocess.PIPE, stderr=log,
        )  # fmt: skip
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 30)
    assert b"listening on" in line, line
    return process


async def test_a_kill_midway_loses_no_confirmed_commit_and_the_rest_are_pushed_again(
    tmp_path: Path,
) -> None:
    data, port = tmp_path / "data", _free_port()
    server = await _serve(data, port)
    client = await Node.open(MemoryStorage(), durable=False)
    await mycelia.connect(client, f"ws://127.0.0.1:{port}", max_backoff=0.2)
    await client.wait_ready(timeout=30)
    async with client.context().transaction() as trx:
        counter = trx.create(Counter).id
    transactions: list[Transaction] = []
    for i in range(1, COMMITS + 1):
        trx = client.context().transaction(wait="local")
        async with trx:
            (await trx.edit(Counter, counter)).n = i
        transactions.append(trx)
    confirmed = [asyncio.ensure_future(t.confirmed()) for t in transactions]
    await asyncio.wait_for(confirmed[COMMITS // 4], 60)  # a quarter confirmed at least...
    os.kill(server.pid, signal.SIGSTOP)  # ... then it stops dead, mid-stream however fast
    before_kill = [i for i, c in enumerate(confirmed) if c.done()]
    server.kill()  # SIGKILL, stopped
    await server.wait()
    assert len(before_kill) < COMMITS, "everything was confirmed before the kill"
    server = await _serve(data, port)
    try:
        await asyncio.wait_for(asyncio.gather(*confirmed), 120)  # the rest, pushed again
        mine = await client.context().get(Counter, counter)
    finally:
        server.kill()
        await server.wait()
        await client.close()
    store = LmdbStorage(data)
    try:
        history = await store.events_of(counter)
        state = await store.get_state(counter)
    finally:
        await store.close()
    assert [e.generation for e in history] == list(range(1, COMMITS + 2))  # one chain
    assert state is not None
    assert state.state.head == mine.head  # the server ends where the client's last commit is
    assert mine.n == COMMITS
