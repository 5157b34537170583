"""Storage benchmarks (issue 5): LMDB and PostgreSQL, each next to its raw primitive.

Targets: ingest 100,000 events in batches of 1,000 on LMDB, durable, ≥ 30,000 events/s;
fetch ``ORDER BY x LIMIT 20`` with a range on ``x`` over 100,000 entities on LMDB ≤ 5 ms
(the field index, next to the scan + ``sort_rows`` baseline; issue 7);
64 concurrent committers (one LWW field each) on LMDB, durable, with group commit,
≥ 10,000 commits/s and p99 ≤ 20 ms; sequential single commits on LMDB, durable, within
1.5x of a raw LMDB put+fsync per transaction; ingest 100,000 events in batches of 1,000 on
PostgreSQL ≥ 20,000 events/s; reopening an LMDB store of 1,000,000 events ≤ 1 s; a
one-character transaction on a durable LMDB node, 120,000 vs 1,000 characters of text,
≤ 1.5x (issue 13). A comparison walk over an in-process engine, asking it for an eighth of
the read-ahead instead of all of it: ≤ 1.2x the time down two long branches, and fewer
events read for a short walk over a long history.

Run: ``python -m benches.bench_storage`` (``--quick`` scales the sizes down; PostgreSQL
comes from ``MYCELIA_TEST_DSN`` or a throwaway cluster, with fsync on).
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import lmdb

from benches.bench_entity import Doc1, build_ops, spots
from benches.harness import QUICK, Table, fmt_time, options, verdict
from mycelia import Model, Node
from mycelia.entity.backends.lww import encode_diff
from mycelia.entity.values import encode_value
from mycelia.event_dag import compare
from mycelia.proto import AdmittedEvent, Clock, EntityId, Event, EventId
from mycelia.proto.query import parse, sort_rows
from mycelia.retrieval import EventSource, LocalGetter, StagingMap, WriteBatch
from mycelia.storage import MemoryStorage, StorageEngine
from mycelia.storage.lmdb import LmdbStorage
from mycelia.storage.testing import genesis, state_of, update

SMALL = "--quick" in sys.argv  # read at import: the sizes below are module constants


class Counter(Model, collection="counters"):
    n: int


def chain(system: EntityId | None, length: int, seed: int) -> list[Event]:
    """One entity's linear history of ``length`` LWW edits."""
    genesis = Event.genesis(
        collection="counters",
        system=system,
        operations={"lww": [encode_diff({"n": encode_value(0)})]},
        nonce=seed.to_bytes(16, "big"),
    )
    events = [genesis]
    for i in range(1, length):
        events.append(
            Event.update(
                entity_id=genesis.entity_id,
                collection="counters",
                parent=Clock([events[-1].id]),
                operations={"lww": [encode_diff({"n": encode_value(i)})]},
            )
        )
    return events


def admitted(events: list[Event]) -> list[AdmittedEvent]:
    return [AdmittedEvent(e, i + 1) for i, e in enumerate(events)]


def batches(total: int, size: int, system: EntityId | None = None) -> Iterator[list[Event]]:
    """``total`` events in batches of ``size``, each batch one entity's whole chain."""
    for seed in range(total // size):
        yield chain(system, size, seed)


# ---------------------------------------------------------------- raw primitives


def raw_lmdb_ingest(root: Path, work: list[list[AdmittedEvent]]) -> float:
    """Events/s of bare LMDB: one put per event, one durable commit per batch."""
    env = lmdb.open(str(root / "raw-ingest"), map_size=1 << 32, max_dbs=2)
    db = env.open_db(b"events")
    start = time.perf_counter()
    for batch in work:
        with env.begin(write=True) as txn:
            for e in batch:
                txn.put(e.id, e.generation.to_bytes(8, "big") + e.event.to_bytes(), db=db)
    elapsed = time.perf_counter() - start
    env.close()
    return sum(map(len, work)) / elapsed


def raw_lmdb_commit(root: Path, count: int) -> float:
    """Seconds per bare LMDB transaction holding one put, committed with fsync."""
    env = lmdb.open(str(root / "raw-commit"), map_size=1 << 30, max_dbs=2)
    db = env.open_db(b"x")
    start = time.perf_counter()
    for i in range(count):
        with env.begin(write=True) as txn:
            txn.put(os.urandom(32), b"v" * 200 + i.to_bytes(8, "big"), db=db)
    elapsed = time.perf_counter() - start
    env.close()
    return elapsed / count


# ---------------------------------------------------------------- measurements


async def engine_ingest(engine: StorageEngine, work: list[list[AdmittedEvent]]) -> float:
    start = time.perf_counter()
    for batch in work:
        await engine.write(WriteBatch(tuple(batch), (state_of([batch[-1]]),)))
    return sum(map(len, work)) / (time.perf_counter() - start)


async def node_ingest(storage: StorageEngine, total: int) -> float:
    source = await Node.open(MemoryStorage(), durable=True)
    await source.create_system()
    node = await Node.open(storage, durable=True)
    await node.join_system(await source.system_events())
    work = list(batches(total, 1000, source.system_root))
    start = time.perf_counter()
    for batch in work:
        await node.ingest(batch)
    rate = total / (time.perf_counter() - start)
    await node.close()
    return rate


async def concurrent_commits(
    storage: StorageEngine, committers: int, each: int
) -> tuple[float, float]:
    """(commits/s, p99 latency) of ``committers`` tasks each editing its own entity."""
    node = await Node.open(storage, durable=True)
    await node.create_system()
    ctx = node.context()
    async with ctx.transaction() as trx:
        ids = [trx.create(Counter, n=0).id for _ in range(committers)]
    latencies: list[float] = []

    async def commit_loop(entity_id: EntityId) -> None:
        for i in range(each):
            began = time.perf_counter()
            async with ctx.transaction() as trx:
                (await trx.edit(Counter, entity_id)).n = i
            latencies.append(time.perf_counter() - began)

    start = time.perf_counter()
    await asyncio.gather(*(commit_loop(i) for i in ids))
    elapsed = time.perf_counter() - start
    await node.close()
    return committers * each / elapsed, statistics.quantiles(latencies, n=100)[98]


async def sequential_commits(path: Path, count: int) -> float:
    """Seconds per sequential Node commit of one LWW field, LMDB durable."""
    node = await Node.open(LmdbStorage(path), durable=True)
    await node.create_system()
    ctx = node.context()
    async with ctx.transaction() as trx:
        entity_id = trx.create(Counter, n=0).id
    start = time.perf_counter()
    for i in range(count):
        async with ctx.transaction() as trx:
            (await trx.edit(Counter, entity_id)).n = i
    elapsed = time.perf_counter() - start
    await node.close()
    return elapsed / count


async def engine_sequential(path: Path, count: int) -> float:
    """Seconds per sequential engine write of one event and its state, LMDB durable."""
    storage = LmdbStorage(path)
    work = [admitted(chain(None, 1, 10**7 + i)) for i in range(count)]
    start = time.perf_counter()
    for (event,) in work:
        await storage.write(WriteBatch((event,), (state_of([event]),)))
    elapsed = time.perf_counter() - start
    await storage.close()
    return elapsed / count


async def reopen_time(path: Path, total: int) -> float:
    """Seconds to reopen a store of ``total`` events and answer a first read (best of 3)."""
    storage = LmdbStorage(path, durable=False)
    for first in range(0, total // 1000, 10):
        work = [e for seed in range(first, first + 10) for e in admitted(chain(None, 1000, seed))]
        await storage.write(WriteBatch(tuple(work)))
    await storage.close()
    times = []
    for _ in range(3):
        began = time.perf_counter()
        node = await Node.open(LmdbStorage(path), durable=True)
        await node.storage.read_since(0, limit=1)
        times.append(time.perf_counter() - began)
        await node.close()
    return min(times)


async def raw_psycopg_ingest(dsn: str, work: list[list[AdmittedEvent]]) -> float:
    """Events/s of bare psycopg: one unnest INSERT per batch into a plain table, one txn."""
    import psycopg  # noqa: PLC0415 - PostgreSQL is optional

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("DROP TABLE IF EXISTS bench_raw")
        await conn.execute(
            "CREATE TABLE bench_raw (id bytea PRIMARY KEY, entity_id bytea, generation bigint,"
            " parents bytea, body bytea)"
        )
        start = time.perf_counter()
        for batch in work:
            async with conn.transaction():
                await conn.execute(
                    "INSERT INTO bench_raw SELECT * FROM unnest(%b::bytea[], %b::bytea[],"
                    " %b::bigint[], %b::bytea[], %b::bytea[])",
                    (
                        [e.id for e in batch],
                        [e.entity_id for e in batch],
                        [e.generation for e in batch],
                        [b"".join(e.parent.ids) for e in batch],
                        [e.event.to_bytes() for e in batch],
                    ),
                )
        elapsed = time.perf_counter() - start
        await conn.execute("DROP TABLE bench_raw")
    return sum(map(len, work)) / elapsed


async def postgres_rows(total: int) -> list[list[str]]:
    try:  # PostgreSQL is optional; its throwaway cluster lives with the tests
        from tests.storage.pg import PostgresUnavailable, postgres_dsn  # noqa: PLC0415

        from mycelia.storage.postgres import PostgresStorage  # noqa: PLC0415
    except ImportError as exc:
        return [["ingest, PostgreSQL", f"skipped: {exc}", "≥ 20,000/s", "-"]]
    work = [admitted(chain(None, 1000, 10**6 + s)) for s in range(total // 1000)]
    try:
        with postgres_dsn(fsync=True) as dsn:
            raw = await raw_psycopg_ingest(dsn, work)
            engine = await PostgresStorage(dsn, schema="bench_storage").open()
            try:
                rate = await engine_ingest(engine, work)
                await fill_rows(engine, total)
                fetch, scan = await fetch_times(engine, rounds=20)
            finally:
                await engine.close()
                await _drop_schema(dsn, "bench_storage")
    except PostgresUnavailable as exc:
        return [["ingest, PostgreSQL", f"skipped: {exc}", "≥ 20,000/s", "-"]]
    return [
        [
            f"ingest {total:,} events, batches of 1,000, PostgreSQL (engine write)",
            f"{rate:,.0f} events/s (raw unnest insert {raw:,.0f}/s)",
            "≥ 20,000/s",
            verdict(rate >= 20_000),
        ],
        fetch_row("PostgreSQL", total, fetch, scan, target=False),
    ]


async def _drop_schema(dsn: str, schema: str) -> None:
    import psycopg  # noqa: PLC0415

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


async def lmdb_ingest_rows(root: Path, total: int) -> list[list[str]]:
    work = [admitted(b) for b in batches(total, 1000)]
    raw = raw_lmdb_ingest(root, work)
    engine = LmdbStorage(root / "ingest")
    rate = await engine_ingest(engine, work)
    await engine.close()
    through_node = await node_ingest(LmdbStorage(root / "node-ingest"), total)
    in_memory = await node_ingest(MemoryStorage(), total)
    return [
        [
            f"ingest {total:,} events, batches of 1,000, LMDB durable (engine write)",
            f"{rate:,.0f} events/s (raw LMDB put+commit {raw:,.0f}/s)",
            "≥ 30,000/s",
            verdict(rate >= 30_000),
        ],
        [
            "  same through Node.ingest (applier + LMDB)",
            f"{through_node:,.0f} events/s (on MemoryStorage {in_memory:,.0f}/s)",
            "≥ 30,000/s",
            verdict(through_node >= 30_000),
        ],
    ]


async def lmdb_commit_rows(root: Path) -> list[list[str]]:
    each = 20 if SMALL else 100
    commits, p99 = await concurrent_commits(LmdbStorage(root / "concurrent"), 64, each)
    in_memory, _ = await concurrent_commits(MemoryStorage(), 64, each)
    count = 300 if SMALL else 2000
    raw_commit = raw_lmdb_commit(root, count)
    engine = await engine_sequential(root / "engine-sequential", count)
    ours = await sequential_commits(root / "sequential", count)
    return [
        [
            f"64 concurrent committers x {each}, LMDB durable, group commit",
            f"{commits:,.0f} commits/s, p99 {fmt_time(p99)} (on MemoryStorage {in_memory:,.0f}/s)",
            "≥ 10,000/s, p99 ≤ 20 ms",
            verdict(commits >= 10_000 and p99 <= 0.02),
        ],
        [
            "sequential single commits, LMDB durable (engine write: 1 event + state)",
            f"{fmt_time(engine)}/commit (raw put+fsync {fmt_time(raw_commit)})",
            "≤ 1.5x raw",
            verdict(engine <= 1.5 * raw_commit) + f" ({engine / raw_commit:.2f}x)",
        ],
        [
            "  same through the Node API (transaction, one LWW field)",
            f"{fmt_time(ours)}/commit",
            "≤ 1.5x raw",
            verdict(ours <= 1.5 * raw_commit) + f" ({ours / raw_commit:.2f}x)",
        ],
    ]


async def durable_text_txn(path: Path, length: int, *, typist: bool, count: int = 200) -> float:
    """Median seconds of a one-character transaction on a durable LMDB node holding one
    text of ``length`` characters, built as ``bench_entity`` builds it."""
    node = await Node.open(LmdbStorage(path), durable=True, progress=False)
    await node.create_system()
    ctx = node.context()
    async with ctx.transaction() as trx:
        entity = trx.create(Doc1, body="").id
    ops = build_ops(length, length, typist=typist)
    for i in range(0, len(ops), 100):
        async with ctx.transaction() as trx:
            body = (await trx.edit(Doc1, entity)).body
            for pos, piece in ops[i : i + 100]:
                body.insert(pos, piece)
    size = len((await ctx.get(Doc1, entity)).body)
    samples = []
    for pos in spots(size, count, 1, typist=typist):
        began = time.perf_counter()
        async with ctx.transaction() as trx:
            (await trx.edit(Doc1, entity)).body.insert(pos, "x")
        samples.append(time.perf_counter() - began)
    await node.close()
    return statistics.median(samples)


async def lmdb_text_rows(root: Path) -> list[list[str]]:
    """A durable write of a text stores its base and log, not the whole document (issue 13)."""
    long = 20_000 if SMALL else 120_000
    rows = []
    for typist in (True, False):
        how = "typed at a cursor" if typist else "at random places"
        short = await durable_text_txn(root / f"text-1000-{typist}", 1_000, typist=typist)
        grown = await durable_text_txn(root / f"text-{long}-{typist}", long, typist=typist)
        rows.append(
            [
                f"one-char txn, LMDB durable, {long:,} vs 1,000 chars {how}",
                f"{fmt_time(grown)} vs {fmt_time(short)}",
                "≤ 1.5x",
                verdict(grown <= 1.5 * short) + f" ({grown / short:.2f}x)",
            ]
        )
    return rows


async def lmdb_reopen_rows(root: Path) -> list[list[str]]:
    size = 100_000 if SMALL else 1_000_000
    reopen = await reopen_time(root / "reopen", size)
    return [
        [
            f"reopen an LMDB store of {size:,} events (+ first read)",
            fmt_time(reopen),
            "≤ 1 s",
            verdict(reopen <= 1.0),
        ]
    ]


FETCH = parse("x > ? AND x < ? AND _deleted IS NULL ORDER BY x LIMIT 20")
"""The fetch of the target, as the node sends it (bound, tombstones excluded)."""


async def fill_rows(engine: StorageEngine, total: int) -> None:
    """``total`` entities of collection ``rows`` with a random ``x`` in ±1,000,000."""
    rng = random.Random(2)
    for start in range(0, total, 5000):
        states = tuple(
            state_of([genesis("rows", n)], {"x": rng.randint(-1_000_000, 1_000_000), "g": n % 1000})
            for n in range(start, min(total, start + 5000))
        )
        await engine.write(WriteBatch(states=states))


async def fetch_times(engine: StorageEngine, *, rounds: int = 50) -> tuple[float, float]:
    """Median seconds of :data:`FETCH` (random 100,000-wide windows) and of the baseline:
    ``scan`` plus the reference executor ``sort_rows``."""
    rng = random.Random(3)
    fetches, scans = [], []
    for i in range(rounds):
        low = rng.randint(-1_000_000, 900_000)
        query = FETCH.bind(low, low + 100_000)
        start = time.perf_counter()
        found = await engine.fetch("rows", query)
        fetches.append(time.perf_counter() - start)
        if i % 10 == 0:
            start = time.perf_counter()
            everything = await engine.scan("rows")
            expected = sort_rows([(s.state.entity_id, s.values) for s in everything], query)
            scans.append(time.perf_counter() - start)
            assert [s.state.entity_id for s in found] == [i for i, _ in expected]
    return statistics.median(fetches), statistics.median(scans)


def fetch_row(engine: str, total: int, fetch: float, scan: float, *, target: bool) -> list[str]:
    """A table row for :func:`fetch_times`."""
    return [
        f"fetch range ORDER BY x LIMIT 20, {total:,} entities, {engine}",
        f"{fmt_time(fetch)} (scan + sort_rows {fmt_time(scan)}, {scan / fetch:,.0f}x)",
        "≤ 5 ms" if target else "report",
        verdict(fetch <= 5e-3) if target else "",
    ]


async def lmdb_fetch_rows(root: Path, total: int) -> list[list[str]]:
    engine = LmdbStorage(root / "fetch")
    try:
        await fill_rows(engine, total)
        fetch, scan = await fetch_times(engine)
    finally:
        await engine.close()
    return [fetch_row("LMDB", total, fetch, scan, target=True)]


class Reads:
    """An engine behind a proxy that counts the events it answers with; ``local`` says
    whether the proxy declares the engine's reads local (an eighth of the read-ahead)."""

    def __init__(self, engine: EventSource, *, local: bool) -> None:
        self.engine, self.local_reads, self.events = engine, local, 0

    async def get_events(
        self, ids: Collection[EventId], *, ahead: int = 0
    ) -> Mapping[EventId, AdmittedEvent]:
        found = await self.engine.get_events(ids, ahead=ahead)
        self.events += len(found)
        return found


async def walk_shape(engine: StorageEngine, history: int, branch: int) -> tuple[Clock, Clock]:
    """``history`` events in a line, then two branches of ``branch`` events; their tips."""
    line = [genesis()]
    for i in range(history):
        line.append(update([line[-1]], b"h%d" % i))
    left, right = [line[-1]], [line[-1]]
    for i in range(branch):
        left.append(update([left[-1]], b"l%d" % i))
        right.append(update([right[-1]], b"r%d" % i))
    events = [*line, *left[1:], *right[1:]]
    for start in range(0, len(events), 1000):
        await engine.write(WriteBatch(tuple(events[start : start + 1000])))
    return Clock([left[-1].id]), Clock([right[-1].id])


class Walk(NamedTuple):
    """One walk's median seconds and the events storage answered it with."""

    seconds: float
    reads: int


async def walk_times(engine: StorageEngine, history: int, branch: int) -> tuple[Walk, Walk]:
    """The walk of :func:`walk_shape`'s tips with an eighth of the read-ahead, and with all
    of it, interleaved (``engine`` is closed after)."""
    try:
        subject, other = await walk_shape(engine, history, branch)
        times: dict[bool, list[float]] = {True: [], False: []}
        reads: dict[bool, int] = {}
        for _ in range(7):
            for local in (True, False):
                source = Reads(engine, local=local)
                start = time.perf_counter()
                for _ in range(20):
                    await compare(LocalGetter(StagingMap(), source), subject, other, budget=10**6)
                times[local].append((time.perf_counter() - start) / 20)
                reads[local] = source.events // 20
    finally:
        await engine.close()
    eighth, whole = (Walk(statistics.median(times[k]), reads[k]) for k in (True, False))
    return eighth, whole


async def walk_rows(root: Path) -> list[list[str]]:
    rows = []
    long = 300 if SMALL else 1000
    for name, make in (
        ("MemoryStorage", lambda shape: MemoryStorage()),
        ("LMDB", lambda shape: LmdbStorage(root / f"walks-{shape}")),
    ):
        eighth, whole = await walk_times(make("long"), 0, long)
        ratio = eighth.seconds / whole.seconds
        rows.append(
            [
                f"walk down two {long:,}-event branches, {name}: an eighth of the read-ahead",
                (
                    f"{fmt_time(eighth.seconds)} vs {fmt_time(whole.seconds)} with all of it "
                    f"({ratio:.2f}x)"
                ),
                "≤ 1.2x",
                verdict(ratio <= 1.2),
            ]
        )
        eighth, whole = await walk_times(make("short"), 5000, 3)
        rows.append(
            [
                f"walk of two 3-event branches on 5,000 events, {name}: events read",
                (
                    f"{eighth.reads:,} vs {whole.reads:,} with all of it "
                    f"({fmt_time(eighth.seconds)} vs {fmt_time(whole.seconds)})"
                ),
                "fewer",
                verdict(eighth.reads < whole.reads),
            ]
        )
    return rows


async def run() -> None:
    total = 20_000 if SMALL else 100_000
    with tempfile.TemporaryDirectory(prefix="mycelia-bench-") as tmp:
        root = Path(tmp)
        rows = await lmdb_ingest_rows(root, total)
        rows += await lmdb_commit_rows(root)
        rows += await lmdb_text_rows(root)
        rows += await lmdb_reopen_rows(root)
        rows += await lmdb_fetch_rows(root, total)
        rows += await walk_rows(root)
    rows += await postgres_rows(total)
    Table("storage: LMDB and PostgreSQL", ["case", "measured", "target", "ok"], rows).print()


def main(argv: Sequence[str] | None = None) -> None:
    options(__doc__, argv, QUICK)  # (--help; --quick is read at import, as SMALL)
    asyncio.run(run())


if __name__ == "__main__":
    main()
