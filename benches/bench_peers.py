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
- **W5** the automerge-paper trace (first 5,000 ops by default, ``--w5-trace-ops``): A
  replays it **one op per transaction** (``wait="local"``, delete then insert) on a Text
  field, yielding after each op; B's live query until its text equals the trace's end.

W5 also times 100 ops per transaction (Mycelia only: the peer has no such case). A
workload that raises is reported as failed with its reason; the others still run.

Run: ``python -m benches.bench_peers --peer-python PEER_VENV/bin/python``
(``--only W1,W4``, ``--runs N``, ``--no-warmup``, ``--json FILE``; ``--baseline-src DIR``
also times W4 sequential on another checkout's ``src``, for "no slower than today").
With ``--runs 1`` (and the warm-up) both sides took 26-31 minutes on a loaded 2-core
machine, W3 most of it (the peer's W3 takes 43 s a run on a quiet one, 300-500 s there).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import importlib.util
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import mycelia
from benches.harness import Table
from mycelia import EntityId, Model, Node, Text
from mycelia.storage import MemoryStorage

PEERS = Path(__file__).resolve().parents[2] / "shared" / "peers"
PEER_SCRIPT = PEERS / "pycrdt_ws_bench.py"
TRACE = PEERS.parent / "data" / "automerge-paper.json.gz"
ENTITIES = 1000
FIELDS = 10
EDITS = 1000
W2_EDITS = 10_000
W3_ENTITIES = 100
W3_FIELDS = 5
WAVE = 50
TIMEOUT = 600.0
WORKLOADS = ("W1", "W2", "W3", "W4", "W5")

Figures = dict[str, float]


def peer_module() -> ModuleType:
    """The peer script, imported for its generators (it imports only the standard library
    at the top; pycrdt is imported where it is used)."""
    spec = importlib.util.spec_from_file_location("pycrdt_ws_bench", PEER_SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["pycrdt_ws_bench"] = module
    spec.loader.exec_module(module)
    return module


class Fields(Model, collection="w_entities"):
    """One peer entity: ten string fields, f0 … f9."""

    f0: str = ""
    f1: str = ""
    f2: str = ""
    f3: str = ""
    f4: str = ""
    f5: str = ""
    f6: str = ""
    f7: str = ""
    f8: str = ""
    f9: str = ""


class Doc(Model, collection="w_text"):
    """The peer's root Text."""

    body: Text


@dataclass(frozen=True)
class Sizes:
    runs: int = 3
    warmup: bool = True
    w3_clients: int = 200
    w3_edits: int = 10
    w3_procs: int = 2
    w5_trace_ops: int = 5000


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def serve(data: Path, port: int, src: Path | None = None) -> asyncio.subprocess.Process:
    """A ``mycelia serve`` process on LMDB (``src``: another checkout's source)."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    log = (data.parent / f"serve-{port}.log").open("ab")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "mycelia.cli", "--log-level", "WARNING", "serve",
        "--data", str(data), "--port", str(port),
        stdout=asyncio.subprocess.PIPE, stderr=log, env=env,
    )  # fmt: skip
    assert process.stdout is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), 60)
        if b"listening on" not in line and b"ws://" not in line:
            raise RuntimeError(f"mycelia serve did not start: {line!r}")
    except BaseException:
        process.kill()
        await process.wait()
        raise
    return process


class Server:
    """A ``mycelia serve`` process and what this bench reads of it (/proc, /metrics)."""

    def __init__(self, process: asyncio.subprocess.Process, port: int) -> None:
        self.process = process
        self.port = port

    @classmethod
    async def start(cls, data: Path) -> Server:
        port = free_port()
        return cls(await serve(data, port), port)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def cpu(self, peer: ModuleType) -> float:
        return float(peer.cpu_seconds(self.process.pid))

    def rss_mib(self, peer: ModuleType) -> tuple[float, float]:
        """(VmRSS, VmHWM) in MiB."""
        kib = peer.rss_kib(self.process.pid)
        return kib["VmRSS"] / 1024, kib["VmHWM"] / 1024

    async def wire(self) -> Figures:
        """The server's frame and byte counters (``frames_in``, ``bytes_out``, ...)."""

        def scrape() -> str:
            url = f"http://127.0.0.1:{self.port}/metrics"
            with urllib.request.urlopen(url, timeout=30) as response:
                return str(response.read().decode())

        text = await asyncio.to_thread(scrape)
        out: Figures = {}
        for kind, direction, value in re.findall(
            r'^mycelia_(frames|bytes)_total\{direction="(in|out)"\} (\S+)$', text, re.M
        ):
            out[f"{kind}_{direction}"] = float(value)
        return out

    async def kill(self) -> None:
        """SIGKILL: a crash, not a clean stop."""
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()


def parse_key(key: str) -> tuple[int, str]:
    """``e12.f3`` → (12, ``f3``)."""
    entity, fieldno = key.split(".")
    return int(entity.removeprefix("e")), fieldno


async def client(url: str) -> Node:
    node = await Node.open(MemoryStorage(), durable=False, progress=False)
    await mycelia.connect(node, url, max_backoff=0.2)
    await node.wait_ready(timeout=30)
    return node


async def within(awaitable: Awaitable[Any], what: str, timeout: float = TIMEOUT) -> Any:
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except TimeoutError:
        raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}") from None


class Mirror:
    """A live query kept open by a task that reads its change sets as they come.

    ``views`` holds the current view of every member; ``on_view`` sees each added or
    updated view (the "change callback" of the peer's definitions); ``changed_at`` is when
    the last change set was read (``peer.monotonic``: one clock for all processes).
    """

    def __init__(self, live: Any, on_view: Callable[[Any], None] | None = None) -> None:
        self.live = live
        self.views: dict[EntityId, Any] = {v.id: v for v in live.items}
        self.on_view = on_view
        self.on_change: Callable[[], None] | None = None
        self.changed_at = time.clock_gettime(time.CLOCK_MONOTONIC)
        self.cpu_at = 0.0
        self._grown: tuple[int, asyncio.Future[None]] | None = None
        self._task = asyncio.create_task(self._follow())

    @classmethod
    async def open(
        cls, node: Node, model: type[Model], on_view: Callable[[Any], None] | None = None
    ) -> Mirror:
        return cls(await node.context().query(model, "").__aenter__(), on_view)

    async def _follow(self) -> None:
        async for changes in self.live:
            for view in changes.initial + changes.added + changes.updated:
                self.views[view.id] = view
                if self.on_view is not None:
                    self.on_view(view)
            for view in changes.removed:
                self.views.pop(view.id, None)
            self.changed_at = time.clock_gettime(time.CLOCK_MONOTONIC)
            times = os.times()
            self.cpu_at = times.user + times.system
            if self._grown is not None and len(self.views) >= self._grown[0]:
                self._grown[1].set_result(None)
                self._grown = None
            if self.on_change is not None:
                self.on_change()

    async def wait_members(self, count: int) -> None:
        """Wait until the result holds ``count`` entities."""
        if len(self.views) < count:
            self._grown = (count, asyncio.get_running_loop().create_future())
            await within(self._grown[1], f"a live query holding {count} entities")

    async def close(self) -> None:
        await self.live.close()
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def create_fields(node: Node, count: int) -> list[EntityId]:
    async with node.context().transaction() as trx:
        return [trx.create(Fields).id for _ in range(count)]


async def _set(
    node: Node, ids: Sequence[EntityId], key: str, value: str, *, wait: str
) -> mycelia.Transaction:
    entity, fieldno = parse_key(key)
    trx = node.context().transaction(wait=wait)  # type: ignore[arg-type]
    async with trx:
        setattr(await trx.edit(Fields, ids[entity]), fieldno, value)
    return trx


async def confirm_all(pending: Sequence[mycelia.Transaction]) -> list[BaseException]:
    """Wait for every transaction's confirmation; the refusals and errors met."""
    results = await asyncio.gather(*(t.confirmed() for t in pending), return_exceptions=True)
    return [r for r in results if isinstance(r, BaseException)]


def missing_keys(
    views: dict[EntityId, Any], ids: Sequence[EntityId], expected: dict[str, str]
) -> int:
    out = 0
    for key, value in expected.items():
        entity, fieldno = parse_key(key)
        view = views.get(ids[entity])
        out += view is None or getattr(view, fieldno) != value
    return out


async def repeat(
    label: str, sizes: Sizes, run: Callable[[int], Awaitable[Figures]]
) -> dict[str, list[float]]:
    """One warm-up run (index 0, discarded) unless disabled, then ``runs`` measured runs."""
    out: dict[str, list[float]] = {}
    for i in range(0 if sizes.warmup else 1, sizes.runs + 1):
        gc.collect()  # the last run's garbage is not this run's work (outside the clock)
        t0 = time.perf_counter()
        figures = await run(i)
        kind = "warm-up" if i == 0 else f"run {i}/{sizes.runs}"
        brief = ", ".join(f"{k}={v:.4g}" for k, v in figures.items())
        print(f"  mycelia {label} {kind} ({time.perf_counter() - t0:.1f} s): {brief}", flush=True)
        if i > 0:
            for key, value in figures.items():
                out.setdefault(key, []).append(value)
    return out


# -- W1 ------------------------------------------------------------------------------------


async def w1(peer: ModuleType, sizes: Sizes, workdir: Path) -> dict[str, list[float]]:
    async def run(i: int) -> Figures:
        server = await Server.start(workdir / f"w1-{i}")
        a, b = await client(server.url), await client(server.url)
        try:
            ids = await create_fields(a, ENTITIES)
            a_live = await Mirror.open(a, Fields)
            waiting: list[Any] = [None]  # (entity id, field, value, future)

            def seen(view: Any) -> None:
                want = waiting[0]
                if (
                    want is not None
                    and view.id == want[0]
                    and getattr(view, want[1]) == want[2]
                    and not want[3].done()
                ):
                    want[3].set_result(time.perf_counter())

            b_live = await Mirror.open(b, Fields, seen)
            await b_live.wait_members(ENTITIES)
            await a_live.wait_members(ENTITIES)
            loop = asyncio.get_running_loop()
            lat, pending = [], []
            for key, value in peer.entity_edits(peer.SEED + i, EDITS, ENTITIES, FIELDS):
                entity, fieldno = parse_key(key)
                waiting[0] = (ids[entity], fieldno, value, loop.create_future())
                t0 = time.perf_counter()
                pending.append(await _set(a, ids, key, value, wait="local"))
                lat.append((await within(waiting[0][3], "W1: B seeing A's edit") - t0) * 1e3)
            errors = await confirm_all(pending)
            if errors:
                raise RuntimeError(f"W1: {len(errors)} commits failed, first: {errors[0]!r}")
            await a_live.close()
            await b_live.close()
        finally:
            await a.close()
            await b.close()
            await server.kill()
        lat.sort()
        return {
            "p50": peer.percentile(lat, 0.50),
            "p99": peer.percentile(lat, 0.99),
            "max": lat[-1],
        }

    return await repeat("W1", sizes, run)


# -- W2 ------------------------------------------------------------------------------------


async def w2(peer: ModuleType, sizes: Sizes, workdir: Path) -> dict[str, list[float]]:
    server = await Server.start(workdir / "w2")
    try:
        edits = peer.entity_edits(peer.SEED + 2, W2_EDITS, ENTITIES, FIELDS)
        expected = dict(edits)
        writer = await client(server.url)
        ids = await create_fields(writer, ENTITIES)
        live = await Mirror.open(writer, Fields)
        await live.wait_members(ENTITIES)
        t0 = time.perf_counter()
        pending = []
        for key, value in edits:  # one transaction, one commit per edit
            pending.append(await _set(writer, ids, key, value, wait="local"))
            await asyncio.sleep(0)
        errors = await confirm_all(pending)  # the server holds everything
        build_s = time.perf_counter() - t0
        await live.close()
        await writer.close()
        del pending, live, writer  # the fresh clients measured below hold none of this
        if errors:
            raise RuntimeError(f"W2 build: {len(errors)} commits failed, first: {errors[0]!r}")
        print(
            f"  mycelia W2: {W2_EDITS:,} separate edits ({len(expected):,} distinct keys) "
            f"confirmed in {build_s:.2f} s ({W2_EDITS / build_s:,.0f} edits/s)",
            flush=True,
        )

        async def run(i: int) -> Figures:
            before = await server.wire()
            t0 = time.perf_counter()
            fresh = await client(server.url)
            mirror = await Mirror.open(fresh, Fields)
            await mirror.wait_members(ENTITIES)
            elapsed = time.perf_counter() - t0
            after = await server.wire()
            missing = missing_keys(mirror.views, ids, expected)
            await mirror.close()
            await fresh.close()
            if missing:
                raise RuntimeError(f"W2: {missing} keys missing or stale at the fresh client")
            return {
                "seconds": elapsed,
                "rate": W2_EDITS / elapsed,
                "bytes": after["bytes_out"] - before["bytes_out"],
            }

        return await repeat("W2", sizes, run)
    finally:
        await server.kill()


# -- W3 ------------------------------------------------------------------------------------


def digest(fields: dict[EntityId, Any], ids: Sequence[EntityId], text: str) -> str:
    rows = [[getattr(fields[e], f"f{f}") for f in range(W3_FIELDS)] for e in ids]
    return hashlib.sha256(json.dumps([rows, text]).encode()).hexdigest()


def heads_of(*mirrors: Mirror) -> dict[str, list[str]]:
    return {str(e): sorted(map(str, v.head)) for m in mirrors for e, v in m.views.items()}


class W3Worker:
    """A process hosting clients [first, first + count) of W3, driven over stdin/stdout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(
        cls, workdir: Path, url: str, setup: Path, first: int, count: int, sizes: Sizes
    ) -> W3Worker:
        args = [sys.executable, "-m", "benches.bench_peers", "_w3worker", url, str(setup)]
        args += [str(first), str(count), str(sizes.w3_clients), str(sizes.w3_edits)]
        with (workdir / f"w3-worker-{first}.log").open("ab") as log:
            proc = await asyncio.create_subprocess_exec(
                *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log
            )
        return cls(proc)

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")

    async def expect(self, kind: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = await within(self.proc.stdout.readline(), f"W3 worker {kind}")
            if not line:
                raise RuntimeError(f"W3 worker exited before {kind} (see its log)")
            head, _, payload = line.decode().partition(" ")
            if head == "FAILED":
                raise RuntimeError(f"W3 worker failed: {json.loads(payload)['error']}")
            if head == kind:
                return dict(json.loads(payload))

    async def stop(self) -> None:
        if self.proc.returncode is None:
            try:
                self.send("QUIT")
                await asyncio.wait_for(self.proc.wait(), 60)
            except (TimeoutError, ConnectionError):
                self.proc.kill()
                await self.proc.wait()


async def w3(peer: ModuleType, sizes: Sizes, workdir: Path) -> dict[str, list[float]]:
    procs = max(1, min(sizes.w3_procs, sizes.w3_clients))

    async def run(i: int) -> Figures:
        server = await Server.start(workdir / f"w3-{i}")
        workers: list[W3Worker] = []
        try:
            maker = await client(server.url)
            ids = await create_fields(maker, W3_ENTITIES)
            async with maker.context().transaction() as trx:
                doc = trx.create(Doc, body="").id
            await maker.close()
            setup = workdir / f"w3-{i}.json"
            setup.write_text(json.dumps({"ids": [str(e) for e in ids], "doc": str(doc)}))
            rss_before = server.rss_mib(peer)[0]
            share = -(-sizes.w3_clients // procs)
            for first in range(0, sizes.w3_clients, share):
                count = min(share, sizes.w3_clients - first)
                workers.append(
                    await W3Worker.start(workdir, server.url, setup, first, count, sizes)
                )
            connected = await asyncio.gather(*(w.expect("CONNECTED") for w in workers))
            rss_connected = server.rss_mib(peer)[0]
            wire0, cpu0 = await server.wire(), server.cpu(peer)
            t0 = peer.monotonic()
            for w in workers:
                w.send("GO")
            local = await asyncio.gather(*(w.expect("LOCAL") for w in workers))
            confirmed = await asyncio.gather(*(w.expect("CONFIRMED") for w in workers))
            errors = sum(c["errors"] for c in confirmed)
            if errors:
                first_error = next(c["first"] for c in confirmed if c["errors"])
                raise RuntimeError(f"W3: {errors} commits failed, first: {first_error}")
            # every commit is on the server: its heads are the union of all clients' commits
            probe = await client(server.url)
            p_fields, p_doc = await Mirror.open(probe, Fields), await Mirror.open(probe, Doc)
            await p_fields.wait_members(W3_ENTITIES)
            await p_doc.wait_members(1)
            target = heads_of(p_fields, p_doc)
            for w in workers:
                w.send("TARGET " + json.dumps(target))
            done = await asyncio.gather(*(w.expect("DONE") for w in workers))
            wall = peer.monotonic() - t0
            server_cpu, wire1 = server.cpu(peer) - cpu0, await server.wire()
            total_s = max(x["t"] for x in done) - t0
            rss_after, rss_peak = server.rss_mib(peer)
            digests = {x["digest"] for x in done}
            digests.add(digest(p_fields.views, ids, str(p_doc.views[doc].body)))
            await p_fields.close()
            await p_doc.close()
            await probe.close()
            if len(digests) != 1:
                raise RuntimeError(f"W3: {len(digests)} different documents after convergence")
        finally:
            await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)
            await server.kill()
        edits = sizes.w3_clients * sizes.w3_edits
        return {
            "total_s": total_s,
            "local_s": max(x["t"] for x in local) - t0,
            "rate": edits / total_s,
            "server_cpu_pct": 100 * server_cpu / wall,
            "client_cpu_pct": 100 * sum(x["cpu_s"] for x in done) / total_s,
            "connect_s": max(c["connect_s"] for c in connected),
            "rss_before": rss_before,
            "rss_connected": rss_connected,
            "rss_after": rss_after,
            "rss_peak": rss_peak,
            "sent": wire1["frames_in"] - wire0["frames_in"],
            "received": wire1["frames_out"] - wire0["frames_out"],
            "client_rss": sum(x["rss_kib"] for x in done) / 1024,
            "errors": float(errors),
        }

    return await repeat("W3", sizes, run)


class W3Client:
    """One W3 client: a node with live queries over the 100 entities and the text."""

    def __init__(self, node: Node, fields: Mirror, doc: Mirror) -> None:
        self.node, self.fields, self.doc = node, fields, doc
        self.pending: list[mycelia.Transaction] = []

    @classmethod
    async def connect(cls, url: str) -> W3Client:
        node = await client(url)
        fields, doc = await Mirror.open(node, Fields), await Mirror.open(node, Doc)
        await fields.wait_members(W3_ENTITIES)
        await doc.wait_members(1)
        return cls(node, fields, doc)

    async def edit(self, ops: Sequence[Any], ids: Sequence[EntityId], doc: EntityId) -> None:
        ctx = self.node.context()
        for op in ops:
            trx = ctx.transaction(wait="local")
            async with trx:
                if op.kind == "field":
                    entity, fieldno = parse_key(op.key)
                    setattr(await trx.edit(Fields, ids[entity]), fieldno, op.value)
                else:
                    body = (await trx.edit(Doc, doc)).body
                    body.insert(int(op.at * (len(body) + 1)), op.chars)
            self.pending.append(trx)
            await asyncio.sleep(0)  # yield between edits, as the peer's clients do

    def last_change(self) -> tuple[float, float]:
        """(when, process CPU then) of this client's last change."""
        latest = max((self.fields, self.doc), key=lambda m: m.changed_at)
        return latest.changed_at, latest.cpu_at


async def w3_worker(url: str, spec: dict[str, Any], first: int, count: int, edits: int) -> None:
    peer = peer_module()
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)

    def emit(kind: str, payload: dict[str, Any]) -> None:
        print(kind, json.dumps(payload), flush=True)

    ids = [EntityId.from_base64(e) for e in spec["ids"]]
    doc = EntityId.from_base64(spec["doc"])
    clients: list[W3Client] = []
    try:
        t0 = time.perf_counter()
        for start in range(0, count, WAVE):  # connect in waves of 50
            wave = min(WAVE, count - start)
            clients += await asyncio.gather(*(W3Client.connect(url) for _ in range(wave)))
        emit("CONNECTED", {"connect_s": time.perf_counter() - t0})
        await stdin.readline()  # GO
        cpu0 = peer.cpu_seconds()
        await asyncio.gather(
            *(
                c.edit(
                    peer.mixed_edits(peer.SEED, first + n, edits, W3_ENTITIES, W3_FIELDS), ids, doc
                )
                for n, c in enumerate(clients)
            )
        )
        emit("LOCAL", {"t": peer.monotonic()})
        errors = [e for c in clients for e in await confirm_all(c.pending)]
        emit("CONFIRMED", {"errors": len(errors), "first": repr(errors[0]) if errors else ""})
        line = await stdin.readline()  # TARGET {...}
        target = json.loads(line.decode().partition(" ")[2])
        all_done = loop.create_future()
        left = set(range(len(clients)))

        def check(n: int) -> None:
            c = clients[n]
            if n in left and heads_of(c.fields, c.doc) == target:
                left.discard(n)
                if not left and not all_done.done():
                    all_done.set_result(None)

        for n, c in enumerate(clients):
            c.fields.on_change = c.doc.on_change = lambda n=n: check(n)
            check(n)
        await within(all_done, "W3 convergence")
        last = max((c.last_change() for c in clients), key=lambda x: x[0])
        digests = {digest(c.fields.views, ids, str(c.doc.views[doc].body)) for c in clients}
        emit(
            "DONE",
            {
                "t": last[0],
                "cpu_s": last[1] - cpu0,
                "digest": digests.pop() if len(digests) == 1 else f"{len(digests)} documents",
                "rss_kib": peer.rss_kib(os.getpid())["VmRSS"],
            },
        )
        await stdin.readline()  # QUIT
    except Exception as exc:
        traceback.print_exc()
        emit("FAILED", {"error": repr(exc)})
    finally:
        await asyncio.gather(*(c.node.close() for c in clients), return_exceptions=True)


# -- W4 ------------------------------------------------------------------------------------


async def w4_once(run: int, peer: ModuleType, workdir: Path) -> Figures:
    """One W4 run; returns its figures (rates per second, and keys missing after the kill)."""
    edits = peer.entity_edits(peer.SEED + 4 + run, 2 * EDITS, ENTITIES, FIELDS)
    data, port = workdir / f"w4-{run}", free_port()
    server = Server(await serve(data, port), port)
    node = await client(server.url)
    try:
        ids = await create_fields(node, ENTITIES)  # the entities, before the clock
        live = await Mirror.open(node, Fields)
        await live.wait_members(ENTITIES)
        expected: dict[str, str] = {}
        t0 = time.perf_counter()
        for key, value in edits[:EDITS]:
            await _set(node, ids, key, value, wait="peer")
            expected[key] = value
        sequential = time.perf_counter() - t0
        t0 = time.perf_counter()
        pending = []
        for key, value in edits[EDITS:]:
            pending.append(await _set(node, ids, key, value, wait="local"))
            expected[key] = value
            await asyncio.sleep(0)  # yield between edits, as the peer's client does
        errors = await confirm_all(pending)
        pipelined = time.perf_counter() - t0
        if errors:
            raise RuntimeError(f"W4: {len(errors)} commits failed, first: {errors[0]!r}")
        await live.close()
    finally:
        await server.kill()  # right after the last confirmation: a crash, not a clean stop
        await node.close()
    t0 = time.perf_counter()
    server = Server(await serve(data, port), port)
    start_s = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        fresh = await client(server.url)
        mirror = await Mirror.open(fresh, Fields)
        await mirror.wait_members(ENTITIES)
        reload_s = time.perf_counter() - t0
        missing = missing_keys(mirror.views, ids, expected)
        await mirror.close()
        await fresh.close()
    finally:
        await server.kill()
    return {
        "seq": EDITS / sequential,
        "seq_ms": sequential / EDITS * 1e3,
        "pipe": EDITS / pipelined,
        "start_s": start_s,
        "reload_s": reload_s,
        "missing": float(missing),
    }


async def w4(peer: ModuleType, sizes: Sizes, workdir: Path) -> dict[str, list[float]]:
    return await repeat("W4", sizes, lambda i: w4_once(i, peer, workdir))


SEQUENTIAL_ONLY = """
import asyncio, sys, time
sys.path.insert(0, sys.argv[1])
from benches.bench_peers import peer_module, serve, Fields, EDITS, ENTITIES, FIELDS
from benches.bench_peers import free_port, parse_key
from pathlib import Path
import mycelia
from mycelia import Node
from mycelia.storage import MemoryStorage

async def client(url):  # only what the older API has too
    node = await Node.open(MemoryStorage(), durable=False)
    await mycelia.connect(node, url, max_backoff=0.2)
    await node.wait_ready(timeout=30)
    return node

async def main():
    peer = peer_module()
    edits = peer.entity_edits(peer.SEED + 4 + int(sys.argv[3]), EDITS, ENTITIES, FIELDS)
    data, port = Path(sys.argv[2]), free_port()
    server = await serve(data, port, Path(sys.argv[4]))
    node = await client(f"ws://127.0.0.1:{port}")
    async with node.context().transaction() as trx:
        ids = [trx.create(Fields).id for _ in range(ENTITIES)]
    live = await node.context().query(Fields, "").__aenter__()
    t0 = time.perf_counter()
    for key, value in edits:
        entity, fieldno = parse_key(key)
        async with node.context().transaction() as trx:
            setattr(await trx.edit(Fields, ids[entity]), fieldno, value)
    print(EDITS / (time.perf_counter() - t0))
    await live.close()
    server.kill()
    await server.wait()
    await node.close()

asyncio.run(main())
"""


def baseline_sequential(src: Path, runs: int, workdir: Path) -> float:
    """W4 sequential on another checkout's ``src`` (median edits/s)."""
    rates = []
    for run in range(runs):
        env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{Path(__file__).parents[1]}"}
        out = subprocess.run(
            [sys.executable, "-c", SEQUENTIAL_ONLY, str(Path(__file__).parents[1]),
             str(workdir / f"base-{run}"), str(run), str(src)],
            env=env, capture_output=True, text=True, check=True, timeout=600,
        )  # fmt: skip
        rates.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(rates)


# -- W5 ------------------------------------------------------------------------------------


async def replay(a: Node, b: Node, trace: Any, per: int) -> tuple[float, float]:
    """A replays ``trace`` on a new Doc, ``per`` ops per transaction (``wait="local"``),
    yielding after each; (seconds at A, seconds until B's live query shows the end text)."""
    async with a.context().transaction() as trx:
        doc = trx.create(Doc, body="").id
    a_live = await Mirror.open(a, Doc)
    await a_live.wait_members(1)
    done = asyncio.get_running_loop().create_future()
    end, end_len = trace.end, len(trace.end)

    def check(view: Any) -> None:
        body = view.body
        if view.id == doc and len(body) == end_len and not done.done() and str(body) == end:
            done.set_result(time.perf_counter())

    b_live = await Mirror.open(b, Doc, check)
    await b_live.wait_members(1)
    ctx, pending = a.context(), []
    t0 = time.perf_counter()
    for first in range(0, len(trace.ops), per):
        trx = ctx.transaction(wait="local")
        async with trx:
            body = (await trx.edit(Doc, doc)).body
            for pos, ndel, ins in trace.ops[first : first + per]:  # delete, then insert
                if ndel:
                    body.delete(pos, ndel)
                if ins:
                    body.insert(pos, ins)
        pending.append(trx)
        await asyncio.sleep(0)  # live typing: let the commits stream as we go
    local_s = time.perf_counter() - t0
    conv_s = await within(done, "W5 remote convergence") - t0
    errors = await confirm_all(pending)
    if errors:
        raise RuntimeError(f"W5: {len(errors)} commits failed, first: {errors[0]!r}")
    if str(a_live.views[doc].body) != end:
        raise RuntimeError("W5: A's text differs from the trace's end text")
    await a_live.close()
    await b_live.close()
    return local_s, conv_s


async def w5(peer: ModuleType, sizes: Sizes, workdir: Path) -> dict[str, list[float]]:
    trace = peer.load_automerge_trace(TRACE, sizes.w5_trace_ops)
    print(f"  mycelia W5: {trace.name}", flush=True)

    async def run(i: int) -> Figures:
        server = await Server.start(workdir / f"w5-{i}")
        a, b = await client(server.url), await client(server.url)
        try:
            wire0, cpu0 = await server.wire(), (server.cpu(peer), peer.cpu_seconds())
            local_s, conv_s = await replay(a, b, trace, 1)  # one op, one transaction
            server_cpu, client_cpu = server.cpu(peer) - cpu0[0], peer.cpu_seconds() - cpu0[1]
            wire1 = await server.wire()
            _, batched_s = await replay(a, b, trace, 100)  # the second case
        finally:
            await a.close()
            await b.close()
            await server.kill()
        n = len(trace.ops)
        return {
            "local_rate": n / local_s,
            "conv_s": conv_s,
            "conv_rate": n / conv_s,
            "msgs_in": wire1["frames_in"] - wire0["frames_in"],
            "msgs_out": wire1["frames_out"] - wire0["frames_out"],
            "server_cpu_pct": 100 * server_cpu / conv_s,
            "client_cpu_pct": 100 * client_cpu / conv_s,
            "batched_rate": n / batched_s,
        }

    return await repeat("W5", sizes, run)


# -- the table -----------------------------------------------------------------------------

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
        "--w5-trace-ops", type=int, default=5000, help="first N trace ops (0: all 259,778)"
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
