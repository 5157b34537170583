"""Entity/applier benchmarks (issue 4), MemoryStorage.

Targets: sequential local commits of one LWW field ≥ 20,000 commits/s; ingest of a
10,000-event linear history in one batch ≥ 50,000 events/s; merging a 10-event
concurrent branch into an entity with 100,000 events of history ≤ 10 ms; the
automerge-paper trace (259,778 ops) through ``Text`` in transactions of 100 ops within 3x
of replaying it in bare pycrdt.

Issue 13 adds: a one-character transaction on a 120,000-char text (built by many small
inserts, as editing does) within 1.5x of one on a 1,000-char text, ASCII and accented.

Run: ``python -m benches.bench_entity`` (``--quick``: 20,000 chars and 20,000 trace ops)
"""

from __future__ import annotations

import asyncio
import gzip
import json
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pycrdt import Doc
from pycrdt import Text as YText

from benches.harness import QUICK, Table, fmt_time, options, verdict
from mycelia import Model, Node, Text
from mycelia.entity.backends.lww import encode_diff
from mycelia.entity.values import encode_value
from mycelia.proto import Clock, EntityId, Event
from mycelia.storage import MemoryStorage

TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "automerge-paper.json.gz"


class Counter(Model, collection="counters"):
    n: int


class Doc1(Model, collection="docs"):
    body: Text


async def fresh_node() -> Node:
    node = await Node.open(MemoryStorage(), durable=True)
    await node.create_system()
    return node


async def sequential_commits(count: int) -> float:
    node = await fresh_node()
    ctx = node.context()
    async with ctx.transaction() as trx:
        entity_id = trx.create(Counter, n=0).id
    start = time.perf_counter()
    for i in range(count):
        async with ctx.transaction() as trx:
            (await trx.edit(Counter, entity_id)).n = i
    return count / (time.perf_counter() - start)


def linear_history(root_node: Node, length: int) -> list[Event]:
    assert root_node.system_root is not None
    genesis = Event.genesis(
        collection="counters",
        system=root_node.system_root,
        operations={"lww": [encode_diff({"n": encode_value(0)})]},
        nonce=bytes(16),
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


async def ingest_rate(length: int) -> float:
    source = await fresh_node()
    events = linear_history(source, length)
    rates = []
    for _ in range(3):
        target = await Node.open(MemoryStorage(), durable=True)
        await target.join_system(await source.system_events())
        start = time.perf_counter()
        await target.ingest(events)
        rates.append(length / (time.perf_counter() - start))
    return sorted(rates)[1]


async def merge_time(history: int) -> float:
    source = await fresh_node()
    events = linear_history(source, history)
    node = await Node.open(MemoryStorage(), durable=True)
    await node.join_system(await source.system_events())
    await node.ingest(events)
    entity = events[0].entity_id
    ctx = node.context()
    times = []
    for round_ in range(5):
        # A local edit on the head, plus a 10-event branch from the same head made elsewhere.
        head = (await node.storage.get_state(entity)).state.head  # type: ignore[union-attr]
        branch: list[Event] = []
        parent = head
        for i in range(10):
            e = Event.update(
                entity_id=entity,
                collection="counters",
                parent=parent,
                operations={"lww": [encode_diff({"n": encode_value(-i - 100 * round_)})]},
            )
            branch.append(e)
            parent = Clock([e.id])
        async with ctx.transaction() as trx:
            (await trx.edit(Counter, entity)).n = 10**6 + round_
        start = time.perf_counter()
        await node.ingest(branch)
        times.append(time.perf_counter() - start)
    return sorted(times)[2]


def concurrent_writes(root_node: Node, count: int, tag: int) -> tuple[Event, list[Event]]:
    """A genesis and ``count`` events made concurrently on it, each setting one key (the
    crdt-benchmarks B3.1 shape: every writer saw only the genesis)."""
    assert root_node.system_root is not None
    genesis = Event.genesis(
        collection="counters",
        system=root_node.system_root,
        operations={"lww": [encode_diff({"n": encode_value(0)})]},
        nonce=tag.to_bytes(16, "big"),
    )
    parent = Clock([genesis.id])
    events = [
        Event.update(
            entity_id=genesis.entity_id,
            collection="counters",
            parent=parent,
            operations={"lww": [encode_diff({"n": encode_value(i)})]},
        )
        for i in range(count)
    ]
    return genesis, events


async def wide_head_ingest(
    widths: tuple[int, ...], *, extra: int = 50, rounds: int = 5, durable: bool = True
) -> dict[int, float]:
    """Median seconds to ingest one concurrent event, one at a time, against a head already
    ``width`` wide (the next ``extra`` writers), per width, interleaved; on a durable node
    or (``durable=False``) on a client's cache, which places events by other rules."""
    source = await fresh_node()
    samples: dict[int, list[float]] = {w: [] for w in widths}
    for r in range(rounds):
        for width in widths:
            genesis, events = concurrent_writes(source, width + extra, tag=r * 10_000 + width)
            node = await Node.open(MemoryStorage(), durable=durable)
            await node.join_system(await source.system_events())
            await node.ingest([genesis, *events[:width]])
            start = time.perf_counter()
            for event in events[width:]:
                await node.ingest([event])
            samples[width].append((time.perf_counter() - start) / extra)
    return {w: statistics.median(v) for w, v in samples.items()}


def load_trace() -> list[tuple[int, int, str]]:
    with gzip.open(TRACE) as f:
        data = json.loads(f.read())
    return [(p[0], p[1], p[2]) for txn in data["txns"] for p in txn["patches"]]


def bare_replay(ops: list[tuple[int, int, str]]) -> float:
    doc: Doc[Any] = Doc()
    text = doc.get("t", type=YText)
    start = time.perf_counter()
    for pos, deleted, inserted in ops:
        if deleted:
            del text[pos : pos + deleted]
        if inserted:
            text.insert(pos, inserted)
    return time.perf_counter() - start


async def mycelia_replay(ops: list[tuple[int, int, str]], per_txn: int) -> tuple[float, str]:
    node = await fresh_node()
    ctx = node.context()
    async with ctx.transaction() as trx:
        entity_id = trx.create(Doc1, body="").id
    start = time.perf_counter()
    for i in range(0, len(ops), per_txn):
        async with ctx.transaction() as trx:
            doc = await trx.edit(Doc1, entity_id)
            body = doc.body
            for pos, deleted, inserted in ops[i : i + per_txn]:
                if deleted:
                    body.delete(pos, deleted)
                if inserted:
                    body.insert(pos, inserted)
    elapsed = time.perf_counter() - start
    return elapsed, str((await ctx.get(Doc1, entity_id)).body)


ASCII = "abcdefghij"
ACCENTED = "aéèàçôüßøñ"
"""Text for the non-ASCII rows: mostly two bytes of UTF-8 a character, as French or German
is (Yrs counts bytes, users characters: an ASCII-only bench hides that conversion)."""


def build_ops(
    length: int, seed: int, *, typist: bool, alphabet: str = ASCII
) -> list[tuple[int, str]]:
    """Small inserts (1-10 chars of ``alphabet``) that grow a text to ``length``
    characters: at random places, or (``typist``) at a cursor that jumps to a random place
    2% of the time."""
    rng = random.Random(seed)
    ops: list[tuple[int, str]] = []
    size = cursor = 0
    while size < length:
        if not typist or rng.random() < 0.02:
            cursor = rng.randint(0, size)
        piece = alphabet[: rng.randint(1, 10)]
        ops.append((cursor, piece))
        size += len(piece)
        cursor += len(piece)
    return ops


async def text_node(ops: list[tuple[int, str]]) -> tuple[Node, EntityId]:
    """A node holding one text built by ``ops``, 100 per transaction (one big insert would
    be one Yrs block and hide what editing costs)."""
    node = await fresh_node()
    ctx = node.context()
    async with ctx.transaction() as trx:
        entity_id = trx.create(Doc1, body="").id
    for i in range(0, len(ops), 100):
        async with ctx.transaction() as trx:
            body = (await trx.edit(Doc1, entity_id)).body
            for pos, piece in ops[i : i + 100]:
                body.insert(pos, piece)
    return node, entity_id


def bare_doc(ops: list[tuple[int, str]]) -> YText:
    doc: Doc[Any] = Doc()
    text: YText = doc.get("t", type=YText)
    for pos, piece in ops:
        text.insert(pos, piece)
    return text


def spots(size: int, count: int, seed: int, *, typist: bool) -> list[int]:
    """Where the one-char edits go: random places, or typing on from one random place."""
    rng = random.Random(seed)
    if typist:
        start = rng.randint(0, size)
        return [start + i for i in range(count)]
    return [rng.randint(0, size + i) for i in range(count)]


class YrsClock:
    """Seconds spent inside pycrdt's ``Text.insert`` while it is entered (the Yrs index
    lookup and integration of a one-char edit, whatever document the transaction's fork
    edits): what is left of a transaction's time is Mycelia's own work."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._original = YText.insert

    def __enter__(self) -> YrsClock:
        original, clock = self._original, self

        def timed(text: YText, index: int, value: str, attrs: Any = None) -> None:
            start = time.perf_counter()
            try:
                original(text, index, value, attrs)
            finally:
                clock.seconds += time.perf_counter() - start

        YText.insert = timed  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        YText.insert = self._original  # type: ignore[method-assign]


async def one_char_txns(node: Node, entity_id: EntityId, where: list[int]) -> tuple[float, float]:
    """Seconds per one-character transaction (an insert at each of ``where``), and of
    them, seconds in pycrdt's own insert."""
    ctx = node.context()
    with YrsClock() as yrs:
        start = time.perf_counter()
        for pos in where:
            async with ctx.transaction() as trx:
                (await trx.edit(Doc1, entity_id)).body.insert(pos, "x")
        elapsed = time.perf_counter() - start
    return elapsed / len(where), yrs.seconds / len(where)


def bare_inserts(text: YText, where: list[int]) -> float:
    start = time.perf_counter()
    for pos in where:
        text.insert(pos, "x")
    return (time.perf_counter() - start) / len(where)


async def one_char_costs(
    long: int, *, typist: bool, alphabet: str = ASCII, rounds: int = 7, count: int = 100
) -> dict[tuple[str, int], float]:
    """Median seconds per one-char transaction (``"txn"``), of it outside pycrdt's insert
    (``"own"``: Mycelia's work), and per bare pycrdt insert into a document built the same
    way (``"bare"``), on 1,000 and ``long`` chars of ``alphabet``, interleaved."""
    built = {n: build_ops(n, n, typist=typist, alphabet=alphabet) for n in (1_000, long)}
    nodes = {n: await text_node(ops) for n, ops in built.items()}
    bares = {n: bare_doc(ops) for n, ops in built.items()}
    samples: dict[tuple[str, int], list[float]] = {}
    for r in range(rounds):
        for n, (node, entity_id) in nodes.items():
            size = len(str((await node.context().get(Doc1, entity_id)).body))
            where = spots(size, count, r, typist=typist)
            txn, yrs = await one_char_txns(node, entity_id, where)
            samples.setdefault(("txn", n), []).append(txn)
            samples.setdefault(("own", n), []).append(txn - yrs)
            samples.setdefault(("bare", n), []).append(bare_inserts(bares[n], where))
    return {k: statistics.median(v) for k, v in samples.items()}


async def run(quick: bool) -> None:
    rows = []
    rate = statistics.median([await sequential_commits(3000) for _ in range(5)])
    rows.append(
        [
            "sequential local commits, 1 LWW field (median of 5)",
            f"{rate:,.0f} commits/s",
            "≥ 20,000/s",
            verdict(rate >= 20_000),
        ]
    )
    rate = await ingest_rate(10_000)
    rows.append(
        [
            "ingest 10,000-event linear history, one batch",
            f"{rate:,.0f} events/s",
            "≥ 50,000/s",
            verdict(rate >= 50_000),
        ]
    )
    for durable, where in ((True, "durable node"), (False, "client cache")):
        wide = await wide_head_ingest((50, 1_000), durable=durable)
        ratio = wide[1_000] / wide[50]
        rows.append(
            [
                f"ingest one concurrent event, head width 1,000 vs 50 ({where})",
                f"{fmt_time(wide[1_000])} vs {fmt_time(wide[50])}",
                "≤ 1.5x",
                verdict(ratio <= 1.5) + f" ({ratio:.2f}x)",
            ]
        )
    for history in (100, 100_000):
        t = await merge_time(history)
        rows.append(
            [
                f"merge 10-event branch, history {history:,}",
                fmt_time(t),
                "≤ 10 ms",
                verdict(t <= 0.01),
            ]
        )
    long = 20_000 if quick else 120_000
    for typist, alphabet in ((False, ASCII), (True, ASCII), (True, ACCENTED)):
        costs = await one_char_costs(long, typist=typist, alphabet=alphabet)
        txn, bare = costs[("txn", long)] / costs[("txn", 1_000)], costs[("bare", long)]
        own = costs[("own", long)] / costs[("own", 1_000)]
        own_times = f"{fmt_time(costs[('own', long)])} vs {fmt_time(costs[('own', 1_000)])}"
        how = "typed at a cursor" if typist else "inserted at random places"
        if alphabet != ASCII:
            how += f", text of {alphabet!r}"
        rows.append(
            [
                f"one-char txn, {long:,} vs 1,000 chars {how}",
                (
                    f"{fmt_time(costs[('txn', long)])} vs {fmt_time(costs[('txn', 1_000)])}; "
                    f"bare pycrdt insert {fmt_time(bare)} vs {fmt_time(costs[('bare', 1_000)])}; "
                    f"Mycelia's own work (the txn less its pycrdt insert) {own_times}: {own:.2f}x"
                ),
                "≤ 1.5x",
                verdict(txn <= 1.5) + f" ({txn:.2f}x)",
            ]
        )
    ops = load_trace()
    if quick:
        ops = ops[:20_000]
    bare = bare_replay(ops)
    ours, text = await mycelia_replay(ops, 100)
    if not quick:
        with gzip.open(TRACE) as f:
            expected = json.loads(f.read())["endContent"]
        assert text == expected, "replay through Text does not reproduce the trace's end text"
    ratio = ours / bare
    rows.append(
        [
            f"automerge trace, {len(ops):,} ops, txns of 100",
            f"{fmt_time(ours)} (bare pycrdt {fmt_time(bare)})",
            "≤ 3x bare",
            verdict(ratio <= 3) + f" ({ratio:.2f}x)",
        ]
    )
    Table(
        "entity: commits, ingest, merge, text trace (MemoryStorage)",
        ["case", "measured", "target", "ok"],
        rows,
    ).print()


def main(argv: Sequence[str] | None = None) -> None:
    asyncio.run(run(options(__doc__, argv, QUICK).quick))


if __name__ == "__main__":
    main()
