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

Run: ``python -m benches.bench_cluster [--only latency,w3,scaling] [--runs N]
[--w3-runs N] [--w3-servers 1,2,3] [--w3-deadline S] [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.cluster.processes import Cluster, cluster_database

import mycelia
from benches.bench_peers import parse_key, peer_module
from benches.harness import Table, fmt_time, verdict
from mycelia import EntityId, Model, Node, Text
from mycelia.node.live import LiveQuery
from mycelia.storage import MemoryStorage

ROOT = Path(__file__).resolve().parents[1]
ENTITIES, FIELDS = 100, 5


class Cell(Model, collection="w3_cells"):
    """One W3 entity: five string fields."""

    f0: str = ""
    f1: str = ""
    f2: str = ""
    f3: str = ""
    f4: str = ""


class Doc(Model, collection="w3_doc"):
    """The W3 shared text."""

    text: Text


class Counter(Model, collection="bench_counters"):
    n: int = 0


def rss(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of ``pid``, in MiB."""
    found = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0]) / 1024
    return found


def cpu_of(pid: int) -> float:
    """CPU seconds ``pid`` used so far (user + system)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def postgres_cpu() -> float:
    """CPU seconds every PostgreSQL process on this machine used so far."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as comm:
                    if comm.read().strip() in ("postgres", "postmaster"):
                        total += cpu_of(int(entry))
            except OSError:  # gone meanwhile
                continue
    return total


def machine_busy() -> float:
    """CPU seconds the whole machine spent busy so far (all cores, from /proc/stat)."""
    with open("/proc/stat") as stat:
        ticks = [int(t) for t in stat.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class Meter:
    """CPU used between :meth:`start` and :meth:`stop` by the servers, PostgreSQL, the
    client processes (they report theirs) and everything else on the machine: other
    people's work on a shared machine, the noise that the table should admit to."""

    def __init__(self, servers: Sequence[int]) -> None:
        self.servers = list(servers)
        self._start = self._sample()

    def _sample(self) -> tuple[float, float, float, float, float]:
        servers = sum(cpu_of(p) for p in self.servers)
        return servers, postgres_cpu(), cpu_seconds(), machine_busy(), time.monotonic()

    def start(self) -> None:
        self._start = self._sample()

    def stop(self, clients_cpu: float = 0.0, *, span: float | None = None) -> dict[str, float]:
        """Each share in % of one core (``span``: the run's length, else until now)."""
        end = self._sample()
        servers, pg, driver, busy, elapsed = (b - a for a, b in zip(self._start, end, strict=True))
        span = span or elapsed
        others = busy - servers - pg - driver - clients_cpu
        return {
            "server_cpu_pct": 100 * servers / span,
            "postgres_cpu_pct": 100 * pg / span,
            "client_cpu_pct": 100 * (clients_cpu + driver) / span,
            "others_cpu_pct": max(0.0, 100 * others / elapsed),
        }


CPU_COLUMN = "CPU % of a core: clients / servers / PostgreSQL / others"


def cpu_cell(med: dict[str, float]) -> str:
    """The shares of :class:`Meter`, as one cell."""
    keys = ("client_cpu_pct", "server_cpu_pct", "postgres_cpu_pct", "others_cpu_pct")
    return " / ".join(f"{med[k]:.0f}" for k in keys)


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


# ------------------------------------------------------------------------- latency


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


# ------------------------------------------------------------------------- workers


class Worker:
    """A client process: one JSON line of arguments, then lines of commands and reports."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, job: dict[str, Any]) -> Worker:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benches.bench_cluster", "--worker", json.dumps(job),
            cwd=ROOT, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            limit=1 << 24,
        )  # fmt: skip
        return cls(process)

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")

    async def expect(self, kind: str, timeout: float = 900) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        word, _, payload = line.decode().partition(" ")
        if word != kind:
            raise RuntimeError(f"worker said {line!r}, not {kind}")
        return dict(json.loads(payload))

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()


def emit(kind: str, payload: dict[str, Any]) -> None:
    print(kind, json.dumps(payload), flush=True)


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def progress(first: int, where: Callable[[], str], every: float = 15.0) -> None:
    """Tell stderr where a worker stands every ``every`` seconds (a long run shows its
    progress; cancel to stop)."""
    started = time.monotonic()
    while True:
        await asyncio.sleep(every)
        say(f"  W3 worker {first}: {where()} at {time.monotonic() - started:.0f} s")


async def connect_clients(job: dict[str, Any]) -> list[Node]:
    """The job's clients, client *c* preferring server *c* mod (servers), in waves of 50."""
    urls: list[str] = job["urls"]

    async def one(c: int) -> Node:
        node = await Node.open(MemoryStorage(), durable=False)
        first = c % len(urls)
        await mycelia.connect(node, urls[first:] + urls[:first], max_backoff=1.0)
        await node.wait_ready(timeout=120)
        return node

    clients: list[Node] = []
    ids = range(job["first"], job["first"] + job["count"])
    for start in range(0, len(ids), 50):
        clients.extend(await asyncio.gather(*(one(c) for c in ids[start : start + 50])))
    return clients


async def worker_main(job: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    if job["kind"] == "w3":
        await w3_worker(job, stdin)
    else:
        await scaling_worker(job, stdin)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ------------------------------------------------------------------------- W3


def digest(cells: LiveQuery[Cell], doc: LiveQuery[Doc]) -> str:
    """What a client shows: every entity's id, head and values."""
    rows = sorted(
        (str(v.id), [str(h) for h in v.head], [v.f0, v.f1, v.f2, v.f3, v.f4]) for v in cells.items
    )
    text = [(str(d.id), [str(h) for h in d.head], str(d.text)) for d in doc.items]
    return hashlib.sha256(json.dumps([rows, text]).encode()).hexdigest()


async def wait_loaded(
    changes: asyncio.Event, views: list[tuple[LiveQuery[Cell], LiveQuery[Doc]]]
) -> None:
    """Wait until every client shows every entity (re-checked after each change)."""
    while not all(len(c.items) == ENTITIES and len(d.items) == 1 for c, d in views):
        await asyncio.wait_for(changes.wait(), 300)
        changes.clear()


def heads(cells: LiveQuery[Cell], doc: LiveQuery[Doc]) -> dict[str, list[str]]:
    found = {str(v.id): sorted(str(h) for h in v.head) for v in cells.items}
    found.update((str(d.id), sorted(str(h) for h in d.head)) for d in doc.items)
    return found


async def w3_worker(job: dict[str, Any], stdin: asyncio.StreamReader) -> None:
    peer = peer_module()
    ids = [EntityId.from_base64(i) for i in job["cells"]]
    doc_id = EntityId.from_base64(job["doc"])
    started = time.perf_counter()
    clients = await connect_clients(job)
    views = []
    for node in clients:
        cells = await node.context().query(Cell, "").__aenter__()
        doc = await node.context().query(Doc, "").__aenter__()
        views.append((cells, doc))
    last = [0.0] * len(clients)
    for k, node in enumerate(clients):
        node.on_change(lambda _, k=k: last.__setitem__(k, time.monotonic()))  # type: ignore[misc]
    changed = asyncio.Event()
    for node in clients:
        node.on_change(lambda _: changed.set())
    await wait_loaded(changed, views)
    emit("CONNECTED", {"connect_s": time.perf_counter() - started})

    async def edit(k: int, node: Node) -> list[mycelia.Transaction]:
        pending = []
        for op in peer.mixed_edits(peer.SEED, job["first"] + k, job["edits"], ENTITIES, FIELDS):
            trx = node.context().transaction(wait="local")
            async with trx:
                if op.kind == "field":
                    entity, name = parse_key(op.key)
                    setattr(await trx.edit(Cell, ids[entity]), name, op.value)
                else:
                    text = (await trx.edit(Doc, doc_id)).text
                    text.insert(int(op.at * (len(text) + 1)), op.chars)
            pending.append(trx)
            await asyncio.sleep(0)
        return pending

    await stdin.readline()  # GO
    cpu0 = cpu_seconds()
    confirmed = [0]

    async def confirm(trx: mycelia.Transaction) -> None:
        await trx.confirmed()
        confirmed[0] += 1

    total = len(clients) * job["edits"]
    report = asyncio.ensure_future(
        progress(job["first"], lambda: f"{confirmed[0]}/{total} commits confirmed")
    )
    done = await asyncio.gather(*(edit(k, n) for k, n in enumerate(clients)))
    await asyncio.gather(*(confirm(trx) for pending in done for trx in pending))
    report.cancel()
    emit("CONFIRMED", {"t": time.monotonic()})
    target = json.loads((await stdin.readline()).decode().partition(" ")[2])

    def identical() -> str:
        apart = [k for k, (c, d) in enumerate(views) if heads(c, d) != target]
        line = f"{len(views) - len(apart)}/{len(views)} clients identical"
        if apart:  # what the first one that is not shows (a stuck run says why)
            held = heads(*views[apart[0]])
            wrong = [e for e in target if held.get(e) != target[e]]
            ready = clients[apart[0]]._link.ready
            line += f"; client {apart[0]} (ready={ready}) differs on {len(wrong)} entities"
            line += f" ({', '.join(w[:8] for w in wrong[:3])}; doc={job['doc'][:8]})"
            line += f": holds {held.get(wrong[0])}, wanted {target[wrong[0]]}"
            line += f", pending {len(clients[apart[0]]._applier._pending)}"
        return line

    report = asyncio.ensure_future(progress(job["first"], identical))
    while not all(heads(c, d) == target for c, d in views):
        await asyncio.wait_for(changed.wait(), 300)
        changed.clear()
    report.cancel()
    digests = {digest(c, d) for c, d in views}
    emit("DONE", {
        "t": max(last), "cpu_s": cpu_seconds() - cpu0,
        "digest": digests.pop() if len(digests) == 1 else f"{len(digests)} different states",
        "rss": rss(os.getpid())["VmRSS"],
    })  # fmt: skip
    await stdin.readline()  # QUIT


async def w3_once(
    dsn: str, tmp: Path, servers: int, clients: int, edits: int, *, deadline: float, procs: int = 2
) -> dict[str, float]:
    """One W3 run; raises TimeoutError if the clients are not all confirmed and identical
    within ``deadline`` seconds of the first edit."""
    with cluster_database(dsn) as db:
        cluster = Cluster(db, tmp)
        workers: list[Worker] = []
        try:
            for index in range(servers):
                cluster.start(index)
            seeder = await cluster.client(0)
            async with seeder.context().transaction() as trx:
                cells = [trx.create(Cell).id for _ in range(ENTITIES)]
                doc = trx.create(Doc, text="").id
            pids = [s.process.pid for s in cluster.servers.values()]
            before = [rss(p)["VmRSS"] for p in pids]
            share = -(-clients // procs)
            for first in range(0, clients, share):
                job = {
                    "kind": "w3", "urls": cluster.urls(0), "first": first,
                    "count": min(share, clients - first), "edits": edits,
                    "cells": [str(c) for c in cells], "doc": str(doc),
                }  # fmt: skip
                workers.append(await Worker.start(job))
            connected = await asyncio.gather(*(w.expect("CONNECTED") for w in workers))
            say(f"W3 on {_servers(servers)}: {clients} clients connected and synced")
            middle = [rss(p)["VmRSS"] for p in pids]
            meter = Meter(pids)
            t0 = time.monotonic()
            for w in workers:
                w.send("GO")
            await asyncio.gather(*(w.expect("CONFIRMED", deadline) for w in workers))
            say(f"W3: every commit confirmed {time.monotonic() - t0:.1f} s after the first edit")
            probe = await cluster.client(servers - 1)
            cells_live = await probe.context().query(Cell, "").__aenter__()
            doc_live = await probe.context().query(Doc, "").__aenter__()
            probed = asyncio.Event()
            probe.on_change(lambda _: probed.set())
            await wait_loaded(probed, [(cells_live, doc_live)])
            target = heads(cells_live, doc_live)
            for w in workers:
                w.send("TARGET " + json.dumps(target))
            left = deadline - (time.monotonic() - t0)
            done = await asyncio.gather(*(w.expect("DONE", left) for w in workers))
            total = max(d["t"] for d in done) - t0
            cpu = meter.stop(sum(d["cpu_s"] for d in done), span=total)
            digests = {d["digest"] for d in done} | {digest(cells_live, doc_live)}
            if len(digests) != 1:
                raise RuntimeError(f"W3 did not converge: {digests}")
            after = [rss(p) for p in pids]
            for w in workers:
                w.send("QUIT")
        finally:
            await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)
            await cluster.close()
    figures = {
        "total_s": total,
        "commits_s": clients * edits / total,
        "connect_s": max(c["connect_s"] for c in connected),
        **cpu,
    }
    for i in range(servers):
        figures[f"rss{i} before"] = before[i]
        figures[f"rss{i} connected"] = middle[i]
        figures[f"rss{i} after"] = after[i]["VmRSS"]
        figures[f"rss{i} peak"] = after[i]["VmHWM"]
    return figures


def _servers(count: int) -> str:
    return f"{count} server{'s' if count > 1 else ''}"


def w3_table(results: dict[int, list[dict[str, float]]], clients: int, edits: int) -> Table:
    rows = []
    for servers, measured in results.items():
        if "stalled_s" in measured[0]:
            stalled = f"not identical after {measured[0]['stalled_s']:.0f} s (see below)"
            rows.append([_servers(servers), stalled, "", "", "", ""])
            continue
        med = {k: statistics.median(r[k] for r in measured) for k in measured[0]}
        memory = "; ".join(
            f"s{i} {med[f'rss{i} before']:.0f} / {med[f'rss{i} connected']:.0f} / "
            f"{med[f'rss{i} after']:.0f} (peak {med[f'rss{i} peak']:.0f})"
            for i in range(servers)
        )
        rows.append([
            _servers(servers), f"{med['total_s']:.1f} s",
            f"{med['commits_s']:.0f}/s", f"{med['connect_s']:.1f} s",
            cpu_cell(med), memory,
        ])  # fmt: skip
    runs = max(len(m) for m in results.values())
    title = (
        f"W3 across servers: {clients} clients x {edits} edits, 2 client processes, one "
        f"PostgreSQL ({runs} run{'s' if runs > 1 else ''}, medians; peer: 43.5 s, 46 edits/s)"
    )
    columns = [
        "clients spread over",
        "first edit → all identical",
        "commits/s",
        "connect + sync",
        CPU_COLUMN,
        "server RSS MiB: before / connected / after",
    ]
    return Table(title, columns, rows)


# ------------------------------------------------------------------------- write scaling


async def scaling_worker(job: dict[str, Any], stdin: asyncio.StreamReader) -> None:
    clients = await connect_clients(job)
    entities = []
    for node in clients:
        async with node.context().transaction() as trx:
            entities.append(trx.create(Counter).id)
    emit("CONNECTED", {})

    async def commit(node: Node, entity: EntityId) -> None:
        for n in range(1, job["edits"] + 1):
            async with node.context().transaction() as trx:
                (await trx.edit(Counter, entity)).n = n

    await stdin.readline()  # GO
    cpu0 = cpu_seconds()
    await asyncio.gather(*(commit(n, e) for n, e in zip(clients, entities, strict=True)))
    emit("DONE", {"t": time.monotonic(), "cpu_s": cpu_seconds() - cpu0})
    await stdin.readline()  # QUIT


async def scaling_once(
    dsn: str, tmp: Path, servers: int, committers: int, edits: int
) -> dict[str, float]:
    """Commits/s of ``committers`` sequential committers spread over ``servers``."""
    with cluster_database(dsn) as db:
        cluster = Cluster(db, tmp)
        workers: list[Worker] = []
        try:
            for index in range(servers):
                cluster.start(index)
            half = committers // 2
            for first in (0, half):
                job = {"kind": "scaling", "urls": cluster.urls(0), "first": first,
                       "count": half, "edits": edits}  # fmt: skip
                workers.append(await Worker.start(job))
            await asyncio.gather(*(w.expect("CONNECTED") for w in workers))
            meter = Meter([s.process.pid for s in cluster.servers.values()])
            t0 = time.monotonic()
            for w in workers:
                w.send("GO")
            done = await asyncio.gather(*(w.expect("DONE") for w in workers))
            span = max(d["t"] for d in done) - t0
            cpu = meter.stop(sum(d["cpu_s"] for d in done), span=span)
            for w in workers:
                w.send("QUIT")
        finally:
            await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)
            await cluster.close()
    return {"rate": committers * edits / span, **cpu}


def scaling_table(results: dict[int, list[dict[str, float]]], committers: int, edits: int) -> Table:
    meds = {
        servers: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        for servers, runs in results.items()
    }
    one = meds[1]["rate"]
    rows = [
        [f"through {s} server{'s' if s > 1 else ''}", f"{m['rate']:,.0f}/s",
         f"{m['rate'] / one:.2f}x", cpu_cell(m)]
        for s, m in meds.items()
    ]  # fmt: skip
    runs = len(results[1])
    title = (
        f"Write scaling: {committers} concurrent committers x {edits} commits, each awaited, "
        f"one PostgreSQL, 2 cores ({runs} runs, medians)"
    )
    return Table(title, ["case", "commits/s", "vs 1 server", CPU_COLUMN], rows)


# ------------------------------------------------------------------------- main


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
