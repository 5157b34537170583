"""The five peer workloads (``../shared/peers/README.md``), run on Mycelia beside the peer.

The peer is pycrdt + pycrdt-websocket + SQLite (``../shared/peers/pycrdt_ws_bench.py``),
run in its own venv in the same sitting (``--peer-python``); the ratio to its figure is
the measure, since absolute figures move from machine to machine. The generators are
imported from the peer script itself (standard library only), and the definitions are
followed literally: the same seeds and sizes, one edit per transaction, the same harness
shape (server in its own process, A and B in one process for W1 and W5, W3's clients in
two client processes), one warm-up run then ``--runs`` measured runs, medians (a full
garbage collection before each, outside the clock: one run's garbage is not the next
one's work; a collection of a run's own objects inside it still counts). Each workload
runs on the peer and then at once on Mycelia, so that both sides of a ratio meet the same
load on a shared machine.

Mycelia's server is a real ``mycelia serve`` process on LMDB (fsync on every commit
group; open auth, no tokens: the peer has no authentication either; every event is still
hashed and checked). Clients are ephemeral nodes on MemoryStorage, each with a live query
open over the entities it works on (as an app showing them would, and as a pycrdt client
holds the whole document), so ``trx.edit`` reads locally. An entity field ``e<e>.f<f>``
of the peer's one shared Map is field ``f<f>`` of the ``e``-th :class:`Fields` entity; the
peer's root Text is the ``body`` of one :class:`Doc`. The entities are created before
each clock starts (the peer's Map needs no creation).

- **W1** commit on A → change on B: A commits each of 1,000 field sets with
  ``wait="local"`` (a pycrdt set is local too); the clock stops when B's live query yields
  the new value; the next edit starts after B saw the previous one. p50 / p99 / max.
- **W2** catch-up: one client writes 10,000 field sets (one transaction each, pipelined)
  until the server confirmed all; each run, a fresh client's connect → its live query over
  the 1,000 entities holding the last write of every key. Bytes are the server's frame
  bytes sent meanwhile (its ``/metrics``).
- **W3** 200 clients (two processes, connected in waves of 50) × 10 mixed edits
  (``mixed_edits``: field sets on 100 × 5 keys and 1-4 letter inserts into one Text), one
  ``wait="local"`` transaction each, yielding between edits; the clock stops when the last
  client holds every entity at the server's final head (the union of all commits: what
  Yjs's state vector says). Then every client's digest and a fresh client's must match.
- **W4** durability: 1,000 field sets each awaited until durable on the server (the
  default ``wait``), then 1,000 pipelined until the last is confirmed; kill -9, restart on
  the same files, a fresh client must find every edit.
- **W5** the automerge-paper trace (first 50,000 ops by default, the peer's own size and
  the issue's; ``--w5-trace-ops``): A replays it **one op per transaction**
  (``wait="local"``, delete then insert) on a Text field, yielding after each op; B's live
  query until its text equals the trace's end.

W5 also times 100 ops per transaction (Mycelia only: the peer has no such case). A
workload that raises is reported as failed with its reason; the others still run.

The harness, each workload and the table live in :mod:`benches.peers`; this module reads
the command line, runs the workloads and prints the table.

Run: ``python -m benches.bench_peers --peer-python PEER_VENV/bin/python``
(``--only W1,W4``, ``--runs N``, ``--no-warmup``, ``--json FILE``; ``--baseline-src DIR``
also times W4 sequential on another checkout's ``src``, for "no slower than today").
With ``--runs 1`` (and the warm-up) both sides took 26-31 minutes on a loaded 2-core
machine, W3 most of it (the peer's W3 takes 43 s a run on a quiet one, 300-500 s there).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from benches.harness import Table
from benches.peers.harness import (
    EDITS,
    ENTITIES,
    FIELDS,
    TRACE,
    WORKLOADS,
    Fields,
    Sizes,
    free_port,
    parse_key,
    peer_module,
    serve,
)
from benches.peers.table import Outcome, fmt, peer_figures, table_rows
from benches.peers.w1 import w1
from benches.peers.w2 import w2
from benches.peers.w3 import w3, w3_worker
from benches.peers.w4 import SEQUENTIAL_ONLY, baseline_sequential, w4
from benches.peers.w5 import w5

# What SEQUENTIAL_ONLY imports from this module: it runs against older checkouts too,
# so its imports stay as they are and these names stay importable here.
__all__ = [
    "EDITS",
    "ENTITIES",
    "FIELDS",
    "SEQUENTIAL_ONLY",
    "Fields",
    "free_port",
    "main",
    "parse_key",
    "peer_module",
    "serve",
]


WORKLOAD_FUNCTIONS = {"W1": w1, "W2": w2, "W3": w3, "W4": w4, "W5": w5}


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(argv) if argv is not None else sys.argv[1:]
    if argv[:1] == ["_w3worker"]:
        url, setup, first, count, _, edits = argv[1:7]
        spec = json.loads(Path(setup).read_text())
        asyncio.run(w3_worker(url, spec, int(first), int(count), int(edits)))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated subset, e.g. W1,W4 (default: all five)")
    parser.add_argument("--runs", type=int, default=3, help="measured runs per side (medians)")
    parser.add_argument("--no-warmup", action="store_true", help="skip the warm-up run")
    parser.add_argument("--peer-python", help="the peer venv's python (skip the peer if unset)")
    parser.add_argument("--baseline-src", type=Path, help="another checkout's src/ to compare")
    parser.add_argument(
        "--w3-clients", type=int, default=200, help="W3 clients (default 200, the peer's)"
    )
    parser.add_argument("--w3-edits", type=int, default=10, help="edits per W3 client (default 10)")
    parser.add_argument(
        "--w3-procs", type=int, default=2, help="processes the W3 clients run in (default 2)"
    )
    parser.add_argument(
        "--w5-trace-ops", type=int, default=50_000, help="first N trace ops (0: all 259,778)"
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    wanted = [w.strip().upper() for w in args.only.split(",")] if args.only else list(WORKLOADS)
    if unknown := [w for w in wanted if w not in WORKLOADS]:
        parser.error(f"unknown workload(s) {', '.join(unknown)}: choose from W1 … W5")
    sizes = Sizes(
        runs=args.runs,
        warmup=not args.no_warmup,
        w3_clients=args.w3_clients,
        w3_edits=args.w3_edits,
        w3_procs=args.w3_procs,
        w5_trace_ops=args.w5_trace_ops,
    )
    peer = peer_module()
    trace_name = peer.load_automerge_trace(TRACE, sizes.w5_trace_ops).name
    command = " ".join(["python", "-m", "benches.bench_peers", *argv])
    t_start = time.perf_counter()
    ours: dict[str, Outcome] = {}
    with tempfile.TemporaryDirectory(prefix="mycelia-peers-") as tmp:
        workdir = Path(tmp)
        theirs: dict[str, dict[str, float]] = {}
        for name in wanted:  # the peer, then Mycelia, workload by workload: load moves
            if args.peer_python:
                theirs.update(peer_figures(args.peer_python, [name], sizes, workdir))
            t0 = time.perf_counter()
            outcome = Outcome()
            try:
                outcome.runs = asyncio.run(WORKLOAD_FUNCTIONS[name](peer, sizes, workdir))
            except Exception as exc:
                traceback.print_exc()
                outcome.failed = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            outcome.seconds = time.perf_counter() - t0
            print(f"== mycelia {name} done in {outcome.seconds:.1f} s", flush=True)
            ours[name] = outcome
        base = (
            baseline_sequential(args.baseline_src, args.runs, workdir)
            if args.baseline_src
            else None
        )
    total = time.perf_counter() - t_start
    rows = table_rows(wanted, theirs, ours, sizes, trace_name)
    if base is not None and ours.get("W4") and ours["W4"].runs.get("seq"):
        seq = statistics.median(ours["W4"].runs["seq"])
        rows.append(
            ["W4", "sequential on the baseline checkout (edits/s)", "", fmt(base),
             f"{seq / base:.2f}x of it"]
        )  # fmt: skip
    warm = "one warm-up, then " if sizes.warmup else ""
    peer_note = "peer = pycrdt-websocket + SQLite, same sitting" if theirs else "no peer run"
    Table(
        f"Peer workloads ({warm}{args.runs} runs each, medians; {peer_note}; {total:.0f} s)",
        ["workload", "metric", "peer", "mycelia", "ratio"],
        rows,
    ).print()
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "command": command,
                    "seconds": total,
                    "sizes": sizes.__dict__,
                    "trace": trace_name,
                    "peer": theirs,
                    "mycelia": {k: v.__dict__ for k, v in ours.items()},
                    "baseline_seq": base,
                    "table": rows,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
