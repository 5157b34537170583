"""The printed table: each of Mycelia's figures beside the peer's, and the ratio between.

:data:`ROWS` is the one place that pairs a figure of ours (a key of a workload's figures)
with the peer's (a substring of its metric's name; ``a & b``: a name holding both, ``x +
y``: a sum) and says which way is better; a row with no peer metric shows "—", and a
workload that failed shows its reason in place of each of its figures. The peer's figures
are its own script's medians, run now in its venv (:func:`peer_figures`).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from benches.peers.harness import PEER_SCRIPT, TRACE, Sizes

Better = Literal["higher", "lower", ""]


@dataclass(frozen=True)
class Row:
    """One metric: its label, unit, the peer metric's name (a substring) and ours."""

    workload: str
    label: str
    unit: str
    peer: str
    ours: str
    better: Better = ""


ROWS = (
    Row("W1", "commit on A → change on B, p50", "ms", "commit-to-remote p50", "p50", "lower"),
    Row("W1", "commit on A → change on B, p99", "ms", "commit-to-remote p99", "p99", "lower"),
    Row("W1", "commit on A → change on B, max", "ms", "commit-to-remote max", "max", "lower"),
    Row("W2", "fresh client, 10,000 edits: connect to synced", "s", "connect to synced",
        "seconds", "lower"),
    Row("W2", "catch-up, edits/s equivalent", "edits/s", "edits/s equivalent", "rate", "higher"),
    Row("W2", "bytes received by the fresh client", "bytes", "catch-up bytes", "bytes", "lower"),
    Row("W3", "{clients} clients x {edits} edits: first edit to all identical", "s",
        "to all identical", "total_s", "lower"),
    Row("W3", "  of which: all clients' local edits issued", "s", "local edits issued",
        "local_s"),
    Row("W3", "converged edits/s", "edits/s", "converged edits/s", "rate", "higher"),
    Row("W3", "server CPU while converging", "% of 1 core", "server process CPU",
        "server_cpu_pct"),
    Row("W3", "client processes' CPU while converging", "% of 1 core", "client process & CPU",
        "client_cpu_pct"),
    Row("W3", "connect + initial sync of the clients", "s", "connect + initial sync",
        "connect_s", "lower"),
    Row("W3", "server RSS before clients", "MiB", "RSS before clients", "rss_before"),
    Row("W3", "server RSS, clients connected", "MiB", "clients connected", "rss_connected"),
    Row("W3", "server RSS after convergence", "MiB", "RSS after convergence", "rss_after"),
    Row("W3", "server peak RSS (VmHWM)", "MiB", "peak RSS", "rss_peak"),
    Row("W3", "messages sent by all clients", "msgs", "messages sent by all", "sent", "lower"),
    Row("W3", "messages received by all clients", "msgs", "messages received by all",
        "received", "lower"),
    Row("W3", "client processes' RSS (all clients)", "MiB", "client process RSS", "client_rss"),
    Row("W3", "commits that failed", "commits", "", "errors"),
    Row("W4", "1,000 sequential edits, each awaited until durable", "edits/s",
        "sequential edits", "seq", "higher"),
    Row("W4", "  per edit (commit → durable on the server → ack)", "ms", "per edit", "seq_ms",
        "lower"),
    Row("W4", "1,000 pipelined edits until the last is durable", "edits/s", "pipelined", "pipe",
        "higher"),
    Row("W4", "after kill -9: new server process listening", "s", "after SIGKILL", "start_s",
        "lower"),
    Row("W4", "then a fresh client connects and syncs (2,000 edits)", "s", "fresh client",
        "reload_s", "lower"),
    Row("W4", "keys missing or stale after the restart", "keys", "keys missing", "missing"),
    Row("W5", "{trace}: ops/s at the editing client", "ops/s", "ops/s at the editing",
        "local_rate", "higher"),
    Row("W5", "first op until B's text is the final text", "s", "first op to remote", "conv_s",
        "lower"),
    Row("W5", "end-to-end ops/s (ops / convergence time)", "ops/s", "end-to-end", "conv_rate",
        "higher"),
    Row("W5", "messages sent by A and B (server frames in)", "msgs",
        "messages sent by A + messages sent by B",
        "msgs_in", "lower"),
    Row("W5", "server CPU until convergence", "% of 1 core", "server process CPU",
        "server_cpu_pct"),
    Row("W5", "client process (A and B) CPU until convergence", "% of 1 core",
        "client process", "client_cpu_pct"),
    Row("W5", "100 ops per transaction (Mycelia only): end-to-end ops/s", "ops/s", "",
        "batched_rate"),
)  # fmt: skip


def peer_figures(
    python: str, wanted: Sequence[str], sizes: Sizes, workdir: Path
) -> dict[str, dict[str, float]]:
    """The peer's medians (by workload, then metric name) from its own script, run now."""
    out = workdir / f"peer-{'-'.join(wanted)}.json"
    command = [python, str(PEER_SCRIPT), "--only", ",".join(wanted), "--runs", str(sizes.runs)]
    command += ["--w3-clients", str(sizes.w3_clients), "--w3-edits", str(sizes.w3_edits)]
    command += ["--w3-procs", str(sizes.w3_procs), "--w5-trace-ops", str(sizes.w5_trace_ops)]
    command += ["--trace", str(TRACE), "--json", str(out), "--workdir", str(workdir / "peer")]
    if not sizes.warmup:
        command.append("--no-warmup")
    print("peer:", " ".join(command), flush=True)
    t0 = time.perf_counter()
    tail: deque[str] = deque(maxlen=40)
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:  # its progress as it goes, not its own table
            tail.append(line)
            if line.startswith(("==", "  W", "  [")):
                print(("  peer" if line.startswith("  ") else "peer ") + line.rstrip(), flush=True)
    if proc.returncode:
        raise RuntimeError(f"the peer script failed:\n{''.join(tail)}")
    print(f"peer done in {time.perf_counter() - t0:.0f} s", flush=True)
    figures: dict[str, dict[str, float]] = {}
    for m in json.loads(out.read_text())["metrics"]:
        figures.setdefault(m["workload"], {})[m["name"]] = float(m["median"])
    return figures


def peer_value(theirs: dict[str, dict[str, float]], row: Row) -> float | None:
    """The peer's figure for a row: ``a & b`` names the metric whose name holds both
    substrings, ``x + y`` sums two metrics."""
    if not row.peer:
        return None
    total = 0.0
    for term in row.peer.split(" + "):
        parts = term.split(" & ")
        names = theirs.get(row.workload, {})
        found = [v for name, v in names.items() if all(part in name for part in parts)]
        if not found:
            return None
        total += found[0]
    return total


def fmt(value: float | None) -> str:
    if value is None:
        return "—"
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def ratio(row: Row, theirs: float | None, ours: float | None) -> str:
    """How far ahead or behind Mycelia is (its figure against the peer's)."""
    if not row.better or theirs is None or ours is None or theirs <= 0 or ours <= 0:
        return ""
    ahead = ours / theirs if row.better == "higher" else theirs / ours
    return f"{ahead:.2f}x ahead" if ahead >= 1 else f"{1 / ahead:.2f}x behind"


@dataclass
class Outcome:
    """Mycelia's runs of one workload, or why it failed."""

    runs: dict[str, list[float]] = field(default_factory=dict)
    failed: str = ""
    seconds: float = 0.0


def table_rows(
    wanted: Sequence[str],
    theirs: dict[str, dict[str, float]],
    ours: dict[str, Outcome],
    sizes: Sizes,
    trace_name: str,
) -> list[list[str]]:
    rows = []
    for workload in wanted:
        outcome = ours[workload]
        for row in (r for r in ROWS if r.workload == workload):
            label = row.label.format(
                clients=sizes.w3_clients, edits=sizes.w3_edits, trace=trace_name
            )
            peer = peer_value(theirs, row)
            values = outcome.runs.get(row.ours)
            mine = statistics.median(values) if values else None
            shown = f"failed: {outcome.failed}" if outcome.failed else fmt(mine)
            rows.append(
                [workload, f"{label} ({row.unit})", fmt(peer), shown, ratio(row, peer, mine)]
            )
    return rows
