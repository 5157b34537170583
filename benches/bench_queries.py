"""Query benchmarks (issue 7).

Targets: fetch ``ORDER BY x LIMIT 20`` with a range predicate over 100,000 entities on LMDB
≤ 5 ms (an index, not a scan); one commit with 1,000 live queries registered on the node
≤ 1 ms of query work per commit (the candidate index: only queries the change can affect
are evaluated); a change to a live query holding 1,000 entities ≤ 1.5× one to a live
query holding 1 (issue 13: O(log n), never O(result)), with and without ORDER BY and
LIMIT; subscription establishment for 1,000 matching entities over websockets ≤ 100 ms,
and for 20,000 through an indexed condition ≤ 1.5× through none (a page of an indexed
answer costs about its own rows, not the result's).

Run: ``python -m benches.bench_queries``
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence

import mycelia
from benches.harness import Table, fmt_time, options, verdict
from mycelia import Model, Node
from mycelia.node.live import LiveQuery
from mycelia.storage import MemoryStorage, StorageEngine


class Row(Model, collection="rows"):
    x: int
    group: int
    label: str


async def populated(storage: StorageEngine, count: int, *, batch: int = 1000) -> Node:
    node = await Node.open(storage, durable=True, rng=random.Random(1))
    await node.create_system()
    rng = random.Random(2)
    for start in range(0, count, batch):
        async with node.context().transaction() as trx:
            for i in range(start, min(count, start + batch)):
                trx.create(Row, x=rng.randint(-1_000_000, 1_000_000), group=i % 1000, label=f"r{i}")
    return node


async def fetch_case(storage: StorageEngine, count: int) -> float:
    node = await populated(storage, count)
    ctx = node.context()
    times = []
    for _ in range(20):
        low = random.randint(-1_000_000, 900_000)
        start = time.perf_counter()
        rows = await ctx.fetch(Row, "x > ? AND x < ? ORDER BY x LIMIT 20", low, low + 100_000)
        times.append(time.perf_counter() - start)
        assert len(rows) <= 20
    await node.close()
    return statistics.median(times)


async def live_queries_case(queries: int, *, pinned: bool) -> tuple[float, float]:
    """Median commit time (editing ``x``) with ``queries`` live queries vs none.

    ``pinned``: each query pins ``group`` to a value (the candidate index narrows a commit
    to the few queries of its group); else every query is a range on ``x``, the field each
    commit changes, so every query must be evaluated (the worst case for the index).
    """
    node = await populated(MemoryStorage(), 2000)
    ctx = node.context()
    ids = [v.id for v in await ctx.fetch(Row, "group < 10")]

    async def commits() -> float:
        samples = []
        for i in range(300):
            start = time.perf_counter()
            async with ctx.transaction() as trx:
                (await trx.edit(Row, ids[i % len(ids)])).x = i
            samples.append(time.perf_counter() - start)
        return statistics.median(samples)

    baseline = await commits()
    lives: list[LiveQuery[Row]] = []
    for g in range(queries):
        text = "group = ? AND x > ?" if pinned else "x > ? AND group >= ?"
        live = ctx.query(Row, text, g if pinned else g * 1000, 0)
        await live.__aenter__()
        lives.append(live)
    loaded = await commits()
    for live in lives:
        await live.close()
    await node.close()
    return baseline, loaded


RESULT_QUERIES = ("group = 0", "group = 0 ORDER BY x", "group = 0 ORDER BY x LIMIT 20")


async def result_size_case(text: str, *, rounds: int = 9, commits: int = 40) -> dict[int, float]:
    """Median seconds from a commit editing one member (its label) until the live query
    ``text`` shows it, with the query holding 1 entity and 1,000 (of 1,000 matching; with
    LIMIT 20 it holds 20 of them); rounds alternate between the two nodes."""
    cases = {}
    for held in (1, 1000):
        node = await Node.open(MemoryStorage(), durable=True, rng=random.Random(held))
        await node.create_system()
        async with node.context().transaction() as trx:
            for i in range(1000):
                trx.create(Row, x=i, group=0 if i < held else 1, label="")
        live = node.context().query(Row, text)
        await live.__aenter__()
        cases[held] = (node, live, live.items[0].id)
    samples: dict[int, list[float]] = {held: [] for held in cases}
    for round_ in range(rounds):
        for held, (node, live, member) in cases.items():
            ctx = node.context()
            for i in range(commits):
                live.changes_nowait()
                start = time.perf_counter()
                async with ctx.transaction() as trx:
                    (await trx.edit(Row, member)).label = f"{round_}.{i}"
                await live.wait_settled()
                (change,) = live.changes_nowait()
                samples[held].append(time.perf_counter() - start)
                assert change.updated[0].label == f"{round_}.{i}"
    for node, live, _ in cases.values():
        await live.close()
        await node.close()
    return {held: statistics.median(times) for held, times in samples.items()}


async def subscription_case(
    matching: int, queries: Sequence[str] = ("x >= -1000000",), *, runs: int = 5
) -> dict[str, float]:
    """A fresh client subscribes to ``matching`` entities held by a ``mycelia serve``
    process, through each of ``queries`` (each matches them all), alternately: the median
    seconds of each."""
    with tempfile.TemporaryDirectory() as data:
        async with served(data) as url:
            writer = await Node.open(MemoryStorage(), durable=False)
            await mycelia.connect(writer, url)
            await writer.wait_ready(timeout=30)
            rng = random.Random(5)
            for start in range(0, matching, 1000):
                async with writer.context().transaction() as trx:
                    for i in range(start, min(matching, start + 1000)):
                        x = rng.randint(-999_999, 999_999)
                        trx.create(Row, x=x, group=i % 1000, label=f"r{i}")
            await writer.close()
            times: dict[str, list[float]] = {}
            for _ in range(runs):
                for text in queries:
                    client = await Node.open(MemoryStorage(), durable=False)
                    await mycelia.connect(client, url)
                    await client.wait_ready(timeout=30)
                    began = time.perf_counter()
                    async with client.context().query(Row, text) as live:
                        times.setdefault(text, []).append(time.perf_counter() - began)
                        assert len(live.items) == matching
                    await client.close()
    return {text: statistics.median(each) for text, each in times.items()}


@contextlib.asynccontextmanager
async def served(data: str) -> AsyncIterator[str]:
    """A ``mycelia serve`` process on LMDB in ``data``; yields its URL."""
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
    try:
        yield line.decode().split()[-1]
    finally:
        process.send_signal(signal.SIGTERM)
        await process.wait()


async def run() -> None:
    rows = []
    try:
        from mycelia.storage.lmdb import LmdbStorage  # noqa: PLC0415
    except ImportError:  # pragma: no cover - the LMDB engine is part of the package
        LmdbStorage = None  # type: ignore[assignment,misc]  # noqa: N806
    if LmdbStorage is not None:
        with tempfile.TemporaryDirectory() as data:
            t = await fetch_case(LmdbStorage(data), 100_000)
        rows.append(
            [
                "fetch range ORDER BY x LIMIT 20, 100,000 entities, LMDB",
                fmt_time(t),
                "≤ 5 ms",
                verdict(t <= 5e-3),
            ]
        )
    t = await fetch_case(MemoryStorage(), 100_000)
    rows.append(["same, MemoryStorage (scan + reference executor)", fmt_time(t), "report", ""])
    for pinned in (True, False):
        baseline, loaded = await live_queries_case(1000, pinned=pinned)
        work = loaded - baseline
        shape = "each pinned to a group" if pinned else "all ranges on the edited field"
        rows.append(
            [
                f"one commit with 1,000 live queries ({shape})",
                f"{fmt_time(loaded)} vs {fmt_time(baseline)} without: +{fmt_time(max(work, 0))}",
                "≤ 1 ms query work",
                verdict(work <= 1e-3),
            ]
        )
    for text in RESULT_QUERIES:
        times = await result_size_case(text)
        ratio = times[1000] / times[1]
        rows.append(
            [
                f"a change to a live query holding 1,000 vs 1 ({text!r}"
                + (": 20 of 1,000 matches vs 1 of 1)" if "LIMIT" in text else ")"),
                f"{fmt_time(times[1000])} vs {fmt_time(times[1])}: {ratio:.2f}x",
                "≤ 1.5x",
                verdict(ratio <= 1.5),
            ]
        )
    t = (await subscription_case(1000))["x >= -1000000"]
    rows.append(
        [
            "subscribe to 1,000 matching entities over websockets",
            fmt_time(t),
            "≤ 100 ms",
            verdict(t <= 0.1),
        ]
    )
    large = await subscription_case(20_000, ("x >= -1000000", ""), runs=3)
    indexed, whole = large["x >= -1000000"], large[""]
    rows.append(
        [
            "subscribe to 20,000 entities, indexed condition (x >= ...) vs none",
            f"{fmt_time(indexed)} vs {fmt_time(whole)}: {indexed / whole:.2f}x",
            "≤ 1.5x",
            verdict(indexed / whole <= 1.5),
        ]
    )
    Table("queries and live queries", ["case", "measured", "target", "ok"], rows).print()


def main(argv: Sequence[str] | None = None) -> None:
    options(__doc__, argv)  # --help
    asyncio.run(run())


if __name__ == "__main__":
    main()
