"""W4, durability: awaited and pipelined edits, then kill -9 and a restart that loses none.

Each run writes 1,000 field sets each awaited until durable on the server (the default
``wait``), then 1,000 pipelined until the last is confirmed; the server is killed with
SIGKILL right after and restarted on the same files, and a fresh client must find every
edit. :data:`SEQUENTIAL_ONLY` is the sequential half as a script for another checkout's
``src`` (``--baseline-src``), run in its own process and using only what the older API
has too. It imports its helpers from ``benches.bench_peers`` and runs against older
checkouts as well, so its imports do not change: those names stay importable there.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

from benches.peers.harness import (
    EDITS,
    ENTITIES,
    FIELDS,
    Fields,
    Figures,
    Mirror,
    Server,
    Sizes,
    client,
    confirm_all,
    create_fields,
    free_port,
    missing_keys,
    repeat,
    serve,
    set_field,
)


async def w4_once(run: int, peer: ModuleType, workdir: Path) -> Figures:
    """One W4 run; returns its figures (rates per second, and keys missing after the kill)."""
    edits = peer.entity_edits(peer.SEED + 4 + run, 2 * EDITS, ENTITIES, FIELDS)
    data, port = workdir / f"w4-{run}", free_port()
    server = Server(await serve(data, port), port)
    node = await client(server.url)
    try:
        ids = await create_fields(node, ENTITIES)  # the entities, before the clock
        live = await Mirror.open(node, Fields)
        await live.wait_members(ENTITIES)
        expected: dict[str, str] = {}
        t0 = time.perf_counter()
        for key, value in edits[:EDITS]:
            await set_field(node, ids, key, value, wait="peer")
            expected[key] = value
        sequential = time.perf_counter() - t0
        t0 = time.perf_counter()
        pending = []
        for key, value in edits[EDITS:]:
            pending.append(await set_field(node, ids, key, value, wait="local"))
            expected[key] = value
            await asyncio.sleep(0)  # yield between edits, as the peer's client does
        errors = await confirm_all(pending)
        pipelined = time.perf_counter() - t0
        if errors:
            raise RuntimeError(f"W4: {len(errors)} commits failed, first: {errors[0]!r}")
        await live.close()
    finally:
        await server.kill()  # right after the last confirmation: a crash, not a clean stop
        await node.close()
    t0 = time.perf_counter()
    server = Server(await serve(data, port), port)
    start_s = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        fresh = await client(server.url)
        mirror = await Mirror.open(fresh, Fields)
        await mirror.wait_members(ENTITIES)
        reload_s = time.perf_counter() - t0
        missing = missing_keys(mirror.views, ids, expected)
        await mirror.close()
        await fresh.close()
    finally:
        await server.kill()
    return {
        "seq": EDITS / sequential,
        "seq_ms": sequential / EDITS * 1e3,
        "pipe": EDITS / pipelined,
        "start_s": start_s,
        "reload_s": reload_s,
        "missing": float(missing),
    }


async def w4(peer: ModuleType, sizes: Sizes, workdir: Path) -> dict[str, list[float]]:
    return await repeat("W4", sizes, lambda i: w4_once(i, peer, workdir))


SEQUENTIAL_ONLY = """
import asyncio, sys, time
sys.path.insert(0, sys.argv[1])
from benches.bench_peers import peer_module, serve, Fields, EDITS, ENTITIES, FIELDS
from benches.bench_peers import free_port, parse_key
from pathlib import Path
import mycelia
from mycelia import Node
from mycelia.storage import MemoryStorage

async def client(url):  # only what the older API has too
    node = await Node.open(MemoryStorage(), durable=False)
    await mycelia.connect(node, url, max_backoff=0.2)
    await node.wait_ready(timeout=30)
    return node

async def main():
    peer = peer_module()
    edits = peer.entity_edits(peer.SEED + 4 + int(sys.argv[3]), EDITS, ENTITIES, FIELDS)
    data, port = Path(sys.argv[2]), free_port()
    server = await serve(data, port, Path(sys.argv[4]))
    node = await client(f"ws://127.0.0.1:{port}")
    async with node.context().transaction() as trx:
        ids = [trx.create(Fields).id for _ in range(ENTITIES)]
    live = await node.context().query(Fields, "").__aenter__()
    t0 = time.perf_counter()
    for key, value in edits:
        entity, fieldno = parse_key(key)
        async with node.context().transaction() as trx:
            setattr(await trx.edit(Fields, ids[entity]), fieldno, value)
    print(EDITS / (time.perf_counter() - t0))
    await live.close()
    server.kill()
    await server.wait()
    await node.close()

asyncio.run(main())
"""


def baseline_sequential(src: Path, runs: int, workdir: Path) -> float:
    """W4 sequential on another checkout's ``src`` (median edits/s)."""
    rates = []
    for run in range(runs):
        env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{Path(__file__).parents[2]}"}
        out = subprocess.run(
            [sys.executable, "-c", SEQUENTIAL_ONLY, str(Path(__file__).parents[2]),
             str(workdir / f"base-{run}"), str(run), str(src)],
            env=env, capture_output=True, text=True, check=True, timeout=600,
        )  # fmt: skip
        rates.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(rates)
