"""Simulator benchmarks (issue 8): how fast the deterministic simulator runs.

Reports simulated operations per second for a 5-node run with every fault (3 durable and
2 ephemeral clients speaking the real peering protocol, 200 operations per seed), how
much of that time is the simulator's own code (the rest is the nodes under test), and the
wall time for 1,000 seeds in worker processes (the issue's CI budget: a few minutes on two
slow cores). The issue sets no numeric target: it asks for the report.

Run: ``python -m benches.bench_testing`` (``--quick``: 100 seeds instead of 1,000)
"""

from __future__ import annotations

import cProfile
import os
import pstats
import statistics
import time
from collections.abc import Sequence

from benches.harness import QUICK, Table, fmt_time, options
from mycelia.testing import Faults, SimConfig, plan_for, run_seeds, run_virtual, simulate

CONFIG = SimConfig(durable=3, ephemeral=2, operations=200, faults=Faults.all())
"""The issue's run (live queries watched on every node), as in tests/testing (SOAK)."""
VARIANTS = {
    "without live queries watched": SimConfig(
        durable=3, ephemeral=2, operations=200, faults=Faults.all(), watch=False
    ),
    "4 clients on 2 servers": SimConfig(
        durable=2, ephemeral=4, operations=200, faults=Faults.all(), watch=True
    ),
}


async def one_seed(seed: int, config: SimConfig) -> tuple[float, dict[str, int]]:
    """Seconds for one seed (plan, run, heal, check) and its counters."""
    start = time.perf_counter()
    result = await simulate(seed, config, plan_for(seed, config))
    return time.perf_counter() - start, result.stats


def simulator_share(seed: int = 0) -> float:
    """The share of a seed's run spent in ``mycelia.testing`` code itself (profiled: the rest
    is the nodes under test — transactions, ingests, codecs, storage, pycrdt)."""
    profile = cProfile.Profile()
    profile.enable()
    run_virtual(one_seed(seed, CONFIG))
    profile.disable()
    own = total = 0.0
    for (path, _, _), (_, _, inner, _, _) in pstats.Stats(profile).stats.items():  # type: ignore[attr-defined]
        total += inner
        if f"mycelia{os.sep}testing" in path:
            own += inner
    return own / total


def per_seed(seeds: int) -> Table:
    async def run() -> tuple[list[float], dict[str, int], dict[str, float]]:
        times: list[float] = []
        totals: dict[str, int] = {}
        for seed in range(seeds):
            seconds, stats = await one_seed(seed, CONFIG)
            times.append(seconds)
            for name, n in stats.items():
                totals[name] = totals.get(name, 0) + n
        variants = {}
        for name, config in VARIANTS.items():
            variants[name] = statistics.median([(await one_seed(s, config))[0] for s in range(5)])
        return times, totals, variants

    times, totals, variants = run_virtual(run())
    total = sum(times)
    rows = [
        ["seed (5 nodes, 200 ops, all faults)", fmt_time(statistics.median(times)), "median"],
        ["simulated operations / s", f"{seeds * CONFIG.operations / total:,.0f}", "actions"],
        ["committed transactions / s", f"{totals['commits'] / total:,.0f}", ""],
        ["messages sent / s", f"{totals['sent'] / total:,.0f}", "bytes, decoded on receipt"],
        ["ingests (pushes delivered) / s", f"{totals['pushes ingested'] / total:,.0f}", ""],
        ["peering frames / s", f"{totals.get('frames', 0) / total:,.0f}", "clients and servers"],
        [
            "time in the simulator's own code",
            f"{100 * simulator_share():.0f}%",
            "profiled; the rest is the nodes",
        ],
    ]
    rows.extend(
        [f"seed {name}", fmt_time(seconds), "median of 5"] for name, seconds in variants.items()
    )
    return Table(
        f"Simulator throughput ({seeds} seeds, in process)", ["measure", "value", "note"], rows
    )


def thousand_seeds(seeds: int) -> Table:
    workers = os.cpu_count() or 1
    report = run_seeds(range(seeds), CONFIG, workers=workers)
    report.raise_first()
    rows = [
        [
            f"{seeds} seeds x 5 nodes x 200 ops",
            f"{workers}",
            fmt_time(report.seconds),
            f"{seeds / report.seconds:.1f}",
            f"{report.operations / report.seconds:,.0f}",
        ]
    ]
    if seeds != 1_000:
        rows.append(
            [
                "1,000 seeds (extrapolated)",
                f"{workers}",
                fmt_time(report.seconds * 1_000 / seeds),
                "",
                "",
            ]
        )
    return Table(
        "Seeds in worker processes (the soak)",
        ["run", "workers", "wall time", "seeds/s", "ops/s"],
        rows,
    )


def main(argv: Sequence[str] | None = None) -> None:
    quick = options(__doc__, argv, QUICK).quick
    per_seed(10 if quick else 30).print()
    thousand_seeds(100 if quick else 1_000).print()


if __name__ == "__main__":
    main()
