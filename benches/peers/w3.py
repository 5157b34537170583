"""W3, 200 clients × 10 mixed edits until all are identical, and the processes hosting them.

:func:`w3` seeds the 100 entities and the one Text, then starts ``--w3-procs`` worker
processes (``python -m benches.bench_peers _w3worker …``, :func:`w3_worker`), each
connecting its share of the clients in waves of 50. They speak in lines on stdin/stdout: a
worker says ``CONNECTED``, is told ``GO``, says ``LOCAL`` once its edits are issued and
``CONFIRMED`` once the server answered each (with the failures), is told ``TARGET`` (the
server's heads as a fresh probe client reads them: the union of all commits), says
``DONE`` when every one of its clients holds them, and exits on ``QUIT``; ``FAILED`` at
any point carries its error. The clock runs from GO to the last client's last change;
every client's digest and the probe's must match.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import mycelia
from benches.peers.harness import (
    W3_ENTITIES,
    W3_FIELDS,
    WAVE,
    Doc,
    Fields,
    Figures,
    Mirror,
    Server,
    Sizes,
    client,
    confirm_all,
    create_fields,
    parse_key,
    peer_module,
    repeat,
    within,
)
from mycelia import EntityId, Node


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
        fields = await Mirror.open(node, Fields, track_cpu=True)
        doc = await Mirror.open(node, Doc, track_cpu=True)
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
