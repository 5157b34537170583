"""Several ``mycelia serve --postgres`` processes on one database (issue 14).

Every figure comes from real server processes on one PostgreSQL (a throwaway cluster with
fsync on, :mod:`tests.storage.pg`), each run on a fresh database, and is a median over
``--runs`` runs:

- **Commit → live change, across servers vs on one server.** A client of server 0 commits
  one edit at a time (``wait="local"``, so the clock measures the path to the other
  client, not the writer's acknowledgement); one client of server 0 and one of server 2
  each hold a live query on the entity, and the time until each sees the edit is taken.
  The writer holds one too, as an editor does (and as W1's writer does in
  ``bench_peers``): its edit reads the entity locally, and the clock measures the commit's
  path, not a read-through to the server. Targets: across servers p50 ≤ 5 ms and
  p99 ≤ 20 ms.
- **W3 across servers.** The W3 shape of ``../shared/peers/README.md`` — 200 clients
  connect (in waves of 50) and sync, then each makes 10 edits from ``mixed_edits`` (the
  generators are imported from the peer script), one per transaction, yielding between
  edits: even edits set a field of 100 entities × 5 fields, odd ones insert 1-4 letters
  into one shared text. Clients run in 2 processes; client *c* prefers server *c* mod *S*
  and fails over to the others. The clock runs from the first edit until the last
  client's live queries hold the final heads; then every client's digest and a fresh
  client's must be identical. Reported for the clients spread over 1, 2 and 3 servers:
  convergence time, commits/s, each server's RSS.
- **Write scaling.** 64 concurrent committers (2 client processes), each committing to
  its own entity and waiting for each confirmation, through 1 server vs through 3.

A W3 run whose clients are not all confirmed and identical within ``--w3-deadline``
seconds of the first edit is reported as such, not measured.

Each case, and the harness they share, lives in :mod:`benches.cluster`; this module reads
the command line, starts PostgreSQL, runs the cases and prints their tables (and is the
entry point of the client worker processes, ``--worker``).

Run: ``python -m benches.bench_cluster [--only latency,w3,scaling] [--runs N]
[--w3-runs N] [--w3-servers 1,2,3] [--w3-deadline S] [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benches.cluster.latency import latency_once, latency_table
from benches.cluster.scaling import scaling_once, scaling_table, scaling_worker
from benches.cluster.w3 import w3_once, w3_table, w3_worker
from benches.harness import Table


async def worker_main(job: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    if job["kind"] == "w3":
        await w3_worker(job, stdin)
    else:
        await scaling_worker(job, stdin)


async def run(args: argparse.Namespace, dsn: str, tmp: Path) -> list[Table]:
    tables = []
    quick = args.quick
    if "latency" in args.only:
        edits = 100 if quick else 500
        runs = [await latency_once(dsn, tmp / f"lat{i}", edits) for i in range(args.runs)]
        tables.append(latency_table(runs, edits))
    if "w3" in args.only:
        clients, edits = (40, 4) if quick else args.w3_size
        w3: dict[int, list[dict[str, float]]] = {}
        for servers in args.w3_servers:
            w3[servers] = []
            for i in range(args.w3_runs):
                where = tmp / f"w3-{servers}-{i}"
                try:
                    run = await w3_once(
                        dsn, where, servers, clients, edits, deadline=args.w3_deadline
                    )
                except TimeoutError:
                    w3[servers] = [{"stalled_s": args.w3_deadline}]
                    break
                w3[servers].append(run)
        tables.append(w3_table(w3, clients, edits))
    if "scaling" in args.only:
        committers, edits = (16, 10) if quick else (64, 30)
        scaling = {
            servers: [
                await scaling_once(dsn, tmp / f"sc-{servers}-{i}", servers, committers, edits)
                for i in range(args.runs)
            ]
            for servers in (1, 3)
        }
        tables.append(scaling_table(scaling, committers, edits))
    return tables


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--only", default="latency,w3,scaling", type=lambda s: s.split(","),
        help="comma-separated cases to run, of latency (commit -> live change, same server "
        "and across), w3 (200 clients over 1-3 servers) and scaling (64 committers through "
        "1 vs 3 servers); default: all three",
    )  # fmt: skip
    parser.add_argument("--runs", type=int, default=3, help="runs of latency and scaling")
    parser.add_argument("--w3-runs", type=int, default=1, help="runs of W3 per server count")
    parser.add_argument(
        "--w3-servers", default=[1, 2, 3], type=lambda s: [int(n) for n in s.split(",")],
        help="comma-separated server counts W3 spreads its clients over (default 1,2,3)",
    )  # fmt: skip
    parser.add_argument(
        "--w3-deadline", type=float, default=900.0, help="seconds a W3 run may take to converge"
    )
    parser.add_argument(
        "--w3-size", default=(200, 10), type=lambda s: tuple(int(n) for n in s.split("x")),
        help="W3 clients x edits each (default 200x10, the workload's definition)",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke test)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(list(argv) if argv is not None else sys.argv[1:])
    if args.worker:
        asyncio.run(worker_main(json.loads(args.worker)))
        return
    from tests.storage.pg import postgres_dsn  # noqa: PLC0415 - the benchmark's own server

    with (
        postgres_dsn(fsync=True) as dsn,
        tempfile.TemporaryDirectory(prefix="mycelia-cluster-") as tmp,
    ):
        tables = asyncio.run(run(args, dsn, Path(tmp)))
    for table in tables:
        table.print()


if __name__ == "__main__":
    main()
