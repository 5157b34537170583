"""Peering benchmarks (issue 6) over real websockets on 127.0.0.1.

The server is a ``mycelia serve`` process on LMDB (``--memory`` runs an in-process server
on MemoryStorage instead); clients are nodes in this process. Figures are medians;
pycrdt-websocket's figures, measured on this kind of machine, are the bar.

The last case is a crowd: fresh clients subscribing at once to a large collection, with
the server's peak memory meanwhile (before answers read their rows as they paged them, 20
clients × 30 MB took it to 1.43 GB).

Run: ``python -m benches.bench_peering`` (``--quick`` shrinks the trace and crowd cases)
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import os
import resource
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import mycelia
from benches.bench_entity import build_ops, spots
from benches.harness import QUICK, Table, fmt_time, options, verdict
from mycelia import EntityId, Model, Node, Text
from mycelia.storage import MemoryStorage

TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "automerge-paper.json.gz"


class Counter(Model, collection="counters"):
    n: int
    by: str


class Doc(Model, collection="docs"):
    body: Text


@contextlib.asynccontextmanager
async def server(memory: bool, data: str) -> AsyncIterator[tuple[str, Node | None, int | None]]:
    """A server: a ``mycelia serve`` process on LMDB in ``data``, or an in-process one."""
    if memory:
        node = await Node.open(MemoryStorage(), durable=True)
        await node.create_system()
        running = await mycelia.serve(node, host="127.0.0.1", port=0)
        yield f"ws://127.0.0.1:{running.port}", node, None
        await running.close()
        await node.close()
        return
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "mycelia.cli",
        "--log-level",
        "WARNING",
        "serve",
        "--data",
        data,
        "--port",
        "0",
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    line = await process.stdout.readline()
    yield line.decode().split()[-1], None, process.pid
    process.send_signal(signal.SIGTERM)
    await process.wait()


async def server_events(node: Node | None, data: str, entity: EntityId) -> int:
    """How many events of ``entity`` the server holds (its LMDB store once it stopped)."""
    if node is not None:
        return len(await node.storage.events_of(entity))
    from mycelia.storage.lmdb import LmdbStorage  # noqa: PLC0415

    storage = LmdbStorage(data)
    try:
        return len(await storage.events_of(entity))
    finally:
        await storage.close()


async def client(url: str) -> Node:
    node = await Node.open(MemoryStorage(), durable=False)
    await mycelia.connect(node, url)
    await node.wait_ready(timeout=30)
    return node


WAIT: float = 120.0
"""Seconds a case waits for a live query's next change before it fails (never hangs)."""


async def next_change(changes: AsyncIterator[Any]) -> Any:
    """The next change set of a live query; RuntimeError if none comes within WAIT."""
    try:
        async with asyncio.timeout(WAIT):  # no task per call: the latency case times this
            return await anext(changes)
    except TimeoutError:
        raise RuntimeError(f"no live-query change within {WAIT:.0f} s: the case is stuck") from None


def rss_kib(pid: int | None) -> int:
    """Resident memory of ``pid`` (this process when None), in KiB."""
    if pid is None:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def latency(url: str, edits: int) -> list[float]:
    """Commit on A → live-query change on B, ``edits`` times, sequentially."""
    a, b = await client(url), await client(url)
    async with a.context().transaction() as trx:
        entity = trx.create(Counter, n=0, by="a").id
    samples = []
    async with b.context().query(Counter, "n >= 0") as live:
        changes = aiter(live)
        await next_change(changes)
        for i in range(1, edits + 1):
            start = time.perf_counter()
            async with a.context().transaction() as trx:
                (await trx.edit(Counter, entity)).n = i
            while True:
                change = await next_change(changes)
                if any(v.n == i for v in change.added + change.updated):
                    break
            samples.append(time.perf_counter() - start)
    await a.close()
    await b.close()
    return samples


async def history_entity(url: str, edits: int) -> EntityId:
    """An entity built from ``edits`` separate commits, made through one client."""
    a = await client(url)
    async with a.context().transaction() as trx:
        entity = trx.create(Counter, n=0, by="a").id
    for i in range(edits):
        async with a.context().transaction() as trx:
            (await trx.edit(Counter, entity)).n = i
    await a.close()
    return entity


async def fresh_sync(url: str, entity: EntityId) -> float:
    times = []
    for _ in range(5):
        b = await client(url)
        start = time.perf_counter()
        await b.context().get(Counter, entity)
        times.append(time.perf_counter() - start)
        await b.close()
    return statistics.median(times)


async def catch_up(url: str, gap: int) -> float:
    """A client holding an entity at some head catches up a ``gap``-event gap."""
    b = await client(url)
    a = await client(url)
    async with a.context().transaction() as trx:
        entity = trx.create(Counter, n=0, by="a").id
    await b.context().get(Counter, entity)  # b holds the start
    for i in range(gap):
        async with a.context().transaction() as trx:
            (await trx.edit(Counter, entity)).n = i
    start = time.perf_counter()
    view = await b.context().get(Counter, entity)
    elapsed = time.perf_counter() - start
    assert view.n == gap - 1
    await a.close()
    await b.close()
    return gap / elapsed


async def many_clients(
    url: str, clients: int, edits: int, pid: int | None
) -> tuple[float, EntityId, int]:
    """``clients`` clients × ``edits`` edits on one entity: time until all agree."""
    nodes = [await client(url) for _ in range(clients)]
    async with nodes[0].context().transaction() as trx:
        entity = trx.create(Counter, n=0, by="seed").id
    for node in nodes:
        await node.context().get(Counter, entity)
    rss_before = rss_kib(pid)
    start = time.perf_counter()

    async def edit(node: Node, who: int) -> None:
        for i in range(edits):
            async with node.context().transaction() as trx:
                handle = await trx.edit(Counter, entity)
                handle.n, handle.by = who * edits + i, f"c{who}"

    await asyncio.gather(*(edit(n, i) for i, n in enumerate(nodes)))
    heads = {(await n.context().get(Counter, entity)).head for n in nodes}
    elapsed = time.perf_counter() - start
    growth = rss_kib(pid) - rss_before
    for node in nodes:
        await node.close()
    assert len(heads) == 1, "clients disagree"
    return elapsed, entity, growth


class Blob(Model, collection="blobs"):
    data: bytes


def peak_kib(pid: int, *, reset: bool = False) -> int:
    """``pid``'s peak resident memory in KiB (VmHWM), reset to its current one first if
    asked (``/proc/PID/clear_refs``, Linux 4.0+)."""
    if reset:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


async def crowd_subscribes(
    url: str, pid: int | None, *, clients: int, rows: int, size: int
) -> tuple[float, int | None]:
    """``clients`` fresh clients subscribe at once to ``rows`` entities of ``size`` bytes:
    seconds until every one holds every byte, and the server's peak memory growth meanwhile
    in KiB (None for an in-process server)."""
    writer = await client(url)
    for first in range(0, rows, 10):
        async with writer.context().transaction() as trx:
            for _ in range(min(10, rows - first)):
                trx.create(Blob, data=os.urandom(size))
    await writer.close()
    nodes = [await client(url) for _ in range(clients)]
    before = peak_kib(pid, reset=True) if pid is not None else 0

    async def subscribe(node: Node) -> int:
        async with node.context().query(Blob, "") as live:
            return sum(len(view.data) for view in live.items)

    start = time.perf_counter()
    held = await asyncio.gather(*(subscribe(node) for node in nodes))
    elapsed = time.perf_counter() - start
    growth = peak_kib(pid) - before if pid is not None else None
    for node in nodes:
        await node.close()
    if set(held) != {rows * size}:
        raise RuntimeError(f"a client holds {min(held)} bytes of {rows * size}")
    return elapsed, growth


async def durable_edits(url: str, edits: int) -> float:
    a = await client(url)
    async with a.context().transaction() as trx:
        entity = trx.create(Counter, n=0, by="a").id
    start = time.perf_counter()
    for i in range(edits):
        async with a.context().transaction() as trx:  # returns once the server acknowledged
            (await trx.edit(Counter, entity)).n = i
    rate = edits / (time.perf_counter() - start)
    await a.close()
    return rate


async def trace(url: str, ops: int) -> float:
    with gzip.open(TRACE) as f:
        data = json.loads(f.read())
    patches = [p for txn in data["txns"] for p in txn["patches"]][:ops]
    a, b = await client(url), await client(url)
    async with a.context().transaction() as trx:
        entity = trx.create(Doc, body="").id
    expected = ""
    for pos, deleted, inserted in patches:
        expected = expected[:pos] + inserted + expected[pos + deleted :]
    async with b.context().query(Doc, "") as live:
        changes = aiter(live)
        await next_change(changes)
        start = time.perf_counter()
        for i in range(0, len(patches), 100):
            async with a.context().transaction() as trx:
                body = (await trx.edit(Doc, entity)).body
                for pos, deleted, inserted in patches[i : i + 100]:
                    if deleted:
                        body.delete(pos, deleted)
                    if inserted:
                        body.insert(pos, inserted)
        while not any(v.id == entity and str(v.body) == expected for v in live.items):
            await next_change(changes)
        elapsed = time.perf_counter() - start
    await a.close()
    await b.close()
    return elapsed


async def one_char_remote(
    url: str, long: int, *, typist: bool, rounds: int = 5, count: int = 40
) -> dict[int, float]:
    """Median seconds from a one-character transaction on A (awaited until the server took
    it) to B's live query showing it, on a 1,000-char and a ``long`` text built as
    ``bench_entity`` builds them (small inserts, 100 per transaction), sizes interleaved."""
    a, b = await client(url), await client(url)
    docs: dict[int, EntityId] = {}
    for n in (1_000, long):
        async with a.context().transaction() as trx:
            docs[n] = trx.create(Doc, body="").id
        ops = build_ops(n, n, typist=typist)
        for i in range(0, len(ops), 100):
            async with a.context().transaction() as trx:
                body = (await trx.edit(Doc, docs[n])).body
                for pos, piece in ops[i : i + 100]:
                    body.insert(pos, piece)
    samples: dict[int, list[float]] = {n: [] for n in docs}
    async with b.context().query(Doc, "") as live:
        changes = aiter(live)
        lengths = {v.id: len(v.body) for v in (await next_change(changes)).initial}
        for r in range(rounds):
            for n, entity in docs.items():
                while lengths.get(entity, 0) < n:  # B holds what A built
                    change = await next_change(changes)
                    lengths.update((v.id, len(v.body)) for v in change.added + change.updated)
                for pos in spots(lengths[entity], count, r, typist=typist):
                    start = time.perf_counter()
                    async with a.context().transaction() as trx:
                        (await trx.edit(Doc, entity)).body.insert(pos, "x")
                    target = lengths[entity] + 1
                    while lengths[entity] < target:
                        change = await next_change(changes)
                        lengths.update((v.id, len(v.body)) for v in change.added + change.updated)
                    samples[n].append(time.perf_counter() - start)
    await a.close()
    await b.close()
    return {n: statistics.median(v) for n, v in samples.items()}


async def run(memory: bool, quick: bool) -> None:
    with tempfile.TemporaryDirectory() as data:
        await _run(memory, quick, data)


async def _run(memory: bool, quick: bool, data: str) -> None:
    rows = []
    async with server(memory, data) as (url, node, pid):
        samples = sorted(await latency(url, 1000))
        p50, p99 = samples[len(samples) // 2], samples[int(len(samples) * 0.99)]
        rows.append(
            [
                "commit on A → live change on B, 1,000 edits",
                f"p50 {fmt_time(p50)}, p99 {fmt_time(p99)}",
                "p50 0.42 ms, p99 0.58 ms",
                "p50 ≤ 1 ms, p99 ≤ 5 ms",
                verdict(p50 <= 1e-3 and p99 <= 5e-3),
            ]
        )
        entity = await history_entity(url, 10_000)
        t = await fresh_sync(url, entity)
        rows.append(
            [
                "fresh client syncs a 10,000-edit entity",
                fmt_time(t),
                "12 ms",
                "≤ 12 ms",
                verdict(t <= 0.012),
            ]
        )
        rate = await catch_up(url, 10_000)
        # The server answers with whichever is smaller: here a snapshot, not 10,000 events.
        rows.append(
            [
                "catch-up of a 10,000-event gap (gap / time)",
                f"{rate:,.0f} events/s",
                "—",
                "≥ 30,000 events/s",
                verdict(rate >= 30_000),
            ]
        )
        elapsed, shared, growth = await many_clients(url, 200, 10, pid)
        rate = await durable_edits(url, 1000)
        rows.append(
            [
                "1,000 sequential edits, each durable on the server",
                f"{rate:,.0f} edits/s",
                "603 edits/s",
                "≥ 2,000 edits/s",
                verdict(rate >= 2000),
            ]
        )
        long = 20_000 if quick else 120_000
        for typist in (False, True):
            cost = await one_char_remote(url, long, typist=typist)
            how = "typed at a cursor" if typist else "inserted at random places"
            ratio = cost[long] / cost[1_000]
            rows.append(
                [
                    f"one-char txn A → B, {long:,} vs 1,000 chars {how}",
                    f"{fmt_time(cost[long])} vs {fmt_time(cost[1_000])}",
                    "—",
                    "≤ 1.5x",
                    verdict(ratio <= 1.5) + f" ({ratio:.2f}x)",
                ]
            )
        huge = 200_000 if quick else 1_000_000
        cost = await one_char_remote(url, huge, typist=True, rounds=3, count=20)
        ratio = cost[huge] / cost[1_000]
        rows.append(
            [
                f"one-char txn A → B, {huge:,} vs 1,000 chars typed at a cursor",
                f"{fmt_time(cost[huge])} vs {fmt_time(cost[1_000])}",
                "—",
                "— (reported: the text content is still stored whole)",
                f"{ratio:.2f}x",
            ]
        )
        ops = 5_000 if quick else 50_000
        t = await trace(url, ops)
        rows.append(
            [
                f"automerge trace, first {ops:,} ops, A → B",
                fmt_time(t),
                "13.7 s (50,000 ops)",
                "≤ 13.7 s",
                verdict(t <= 13.7),
            ]
        )
        crowd, blobs, blob = (5, 30, 100 * 1024) if quick else (20, 300, 100 * 1024)
        elapsed_crowd, peak = await crowd_subscribes(url, pid, clients=crowd, rows=blobs, size=blob)
        result_mib = blobs * blob / 2**20
        rows.append(
            [
                f"{crowd} fresh clients subscribe at once to {blobs} entities of 100 KiB",
                f"{fmt_time(elapsed_crowd)}, server peak +"
                + ("—" if peak is None else f"{peak / 1024:.0f} MiB")
                + f" ({result_mib:.0f} MiB each)",
                "—",
                f"peak < {crowd} × the result",
                "—" if peak is None else verdict(peak / 1024 < crowd * result_mib),
            ]
        )
    lost = 200 * 10 + 1 - await server_events(node, data, shared)
    rows.insert(
        3,
        [
            "200 clients × 10 edits, one entity, until identical",
            f"{fmt_time(elapsed)}, lost {lost}, server RSS +{growth / 1024:.1f} MiB",
            "43.5 s, RSS 37→46 MiB",
            "≤ 2 s, 0 lost",
            verdict(elapsed <= 2 and lost == 0),
        ],
    )
    engine = "in-process server, MemoryStorage" if memory else "`mycelia serve` process, LMDB"
    Table(
        f"peering over websockets ({engine})",
        ["case", "Mycelia", "pycrdt-websocket", "target", "ok"],
        rows,
    ).print()


def main(argv: Sequence[str] | None = None) -> None:
    args = options(
        __doc__,
        argv,
        ("--memory", "an in-process server on MemoryStorage, not a mycelia serve process"),
        QUICK,
    )
    asyncio.run(run(args.memory, args.quick))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
