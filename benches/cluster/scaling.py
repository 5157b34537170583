"""Write scaling: concurrent committers, each awaiting every commit, through 1 vs 3 servers.

Two :class:`~benches.cluster.harness.Worker` processes (:func:`scaling_worker`) each
connect half of the committers, create one entity per committer, then on ``GO`` commit to
it ``edits`` times, each commit awaited; the rate is all commits over the time from GO to
the last worker's DONE, and the table sets each server count against one server's rate.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

from tests.cluster.processes import Cluster, cluster_database

from benches.cluster.harness import (
    CPU_COLUMN,
    Counter,
    Meter,
    Worker,
    connect_clients,
    cpu_cell,
    cpu_seconds,
    emit,
)
from benches.harness import Table
from mycelia import EntityId, Node


async def scaling_worker(job: dict[str, Any], stdin: asyncio.StreamReader) -> None:
    clients = await connect_clients(job)
    entities = []
    for node in clients:
        async with node.context().transaction() as trx:
            entities.append(trx.create(Counter).id)
    emit("CONNECTED", {})

    async def commit(node: Node, entity: EntityId) -> None:
        for n in range(1, job["edits"] + 1):
            async with node.context().transaction() as trx:
                (await trx.edit(Counter, entity)).n = n

    await stdin.readline()  # GO
    cpu0 = cpu_seconds()
    await asyncio.gather(*(commit(n, e) for n, e in zip(clients, entities, strict=True)))
    emit("DONE", {"t": time.monotonic(), "cpu_s": cpu_seconds() - cpu0})
    await stdin.readline()  # QUIT


async def scaling_once(
    dsn: str, tmp: Path, servers: int, committers: int, edits: int
) -> dict[str, float]:
    """Commits/s of ``committers`` sequential committers spread over ``servers``."""
    with cluster_database(dsn) as db:
        cluster = Cluster(db, tmp)
        workers: list[Worker] = []
        try:
            for index in range(servers):
                cluster.start(index)
            half = committers // 2
            for first in (0, half):
                job = {"kind": "scaling", "urls": cluster.urls(0), "first": first,
                       "count": half, "edits": edits}  # fmt: skip
                workers.append(await Worker.start(job))
            await asyncio.gather(*(w.expect("CONNECTED") for w in workers))
            meter = Meter([s.process.pid for s in cluster.servers.values()])
            t0 = time.monotonic()
            for w in workers:
                w.send("GO")
            done = await asyncio.gather(*(w.expect("DONE") for w in workers))
            span = max(d["t"] for d in done) - t0
            cpu = meter.stop(sum(d["cpu_s"] for d in done), span=span)
            for w in workers:
                w.send("QUIT")
        finally:
            await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)
            await cluster.close()
    return {"rate": committers * edits / span, **cpu}


def scaling_table(results: dict[int, list[dict[str, float]]], committers: int, edits: int) -> Table:
    meds = {
        servers: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        for servers, runs in results.items()
    }
    one = meds[1]["rate"]
    rows = [
        [f"through {s} server{'s' if s > 1 else ''}", f"{m['rate']:,.0f}/s",
         f"{m['rate'] / one:.2f}x", cpu_cell(m)]
        for s, m in meds.items()
    ]  # fmt: skip
    runs = len(results[1])
    title = (
        f"Write scaling: {committers} concurrent committers x {edits} commits, each awaited, "
        f"one PostgreSQL, 2 cores ({runs} runs, medians)"
    )
    return Table(title, ["case", "commits/s", "vs 1 server", CPU_COLUMN], rows)
