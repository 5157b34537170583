"""Commit → live change on three servers: one client of server 0 writes, two watch.

A client of server 0 commits one edit at a time (``wait="local"``, so the clock measures
the path to the other clients, not the writer's acknowledgement); a client of server 0
and one of server 2 each hold a live query on the entity, and the time until each sees
the edit is taken, after 20 warm-up edits. The writer holds a live query too, so its edit
reads the entity locally. Targets (the table's verdict): across servers p50 ≤ 5 ms and
p99 ≤ 20 ms.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

from tests.cluster.processes import Cluster, cluster_database

from benches.cluster.harness import Counter, Meter, percentile
from benches.harness import Table, fmt_time, verdict
from mycelia.node.live import LiveQuery


async def latency_once(dsn: str, tmp: Path, edits: int) -> dict[str, float]:
    """One run: p50/p99 of commit → live change on server 0 (same) and server 2 (across)."""
    with cluster_database(dsn) as db:
        cluster = Cluster(db, tmp)
        try:
            for index in range(3):
                cluster.start(index)
            writer = await cluster.client(0)
            same, across = await cluster.client(0), await cluster.client(2)
            async with writer.context().transaction() as trx:
                entity = trx.create(Counter).id
            readers = {"same": same, "across": across}
            lives = {
                k: await node.context().query(Counter, "").__aenter__()
                for k, node in {**readers, "writer": writer}.items()
            }
            seen: dict[str, float] = {}
            target = [0]
            arrived = asyncio.Event()

            def listener(name: str, live: LiveQuery[Counter]) -> Any:
                def heard(_: object) -> None:
                    if name not in seen and any(c.n == target[0] for c in live.items):
                        seen[name] = time.perf_counter()
                        if len(seen) == len(readers):
                            arrived.set()

                return heard

            for name, node in readers.items():
                node.on_change(listener(name, lives[name]))
            samples: dict[str, list[float]] = {k: [] for k in readers}
            meter = Meter([s.process.pid for s in cluster.servers.values()])
            for i in range(-20, edits):  # 20 warm-up edits
                target[0] = i + 1000
                seen.clear()
                arrived.clear()
                start = time.perf_counter()
                trx = writer.context().transaction(wait="local")
                async with trx:
                    (await trx.edit(Counter, entity)).n = target[0]
                await asyncio.wait_for(arrived.wait(), 30)
                if i >= 0:
                    for name in readers:
                        samples[name].append(seen[name] - start)
                await trx.confirmed()
            noise = meter.stop()["others_cpu_pct"]
            for live in lives.values():
                await live.close()
        finally:
            await cluster.close()
    figures = {
        f"{name} {q}": percentile(values, p)
        for name, values in samples.items()
        for q, p in (("p50", 0.5), ("p99", 0.99))
    }
    return {**figures, "others": noise}


def latency_table(runs: list[dict[str, float]], edits: int) -> Table:
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    ok = med["across p50"] <= 5e-3 and med["across p99"] <= 20e-3
    rows = [
        [f"same server (client of 0 → client of 0), {edits} edits",
         fmt_time(med["same p50"]), fmt_time(med["same p99"]), "", ""],
        [f"across servers (client of 0 → client of 2), {edits} edits",
         fmt_time(med["across p50"]), fmt_time(med["across p99"]), "p50 ≤ 5 ms, p99 ≤ 20 ms",
         verdict(ok)],
    ]  # fmt: skip
    title = (
        f"Commit → live change on 3 servers, one PostgreSQL ({len(runs)} runs, medians; "
        f"other processes used {med['others']:.0f}% of a core meanwhile)"
    )
    return Table(title, ["path", "p50", "p99", "target", ""], rows)
