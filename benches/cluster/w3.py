"""W3 across servers: 200 clients × 10 mixed edits, spread over 1-3 servers, until identical.

:func:`w3_once` seeds the entities, starts two :class:`~benches.cluster.harness.Worker`
processes (:func:`w3_worker`) and drives them line by line: each says ``CONNECTED`` once
its clients show every entity, is told ``GO``, says ``CONFIRMED`` once every one of its
commits is, is told ``TARGET`` (the heads a fresh probe client of the last server reads),
says ``DONE`` once all its clients hold them, with their digest, and is told ``QUIT``.
The clock runs from GO to the last client's last change; a run that does not reach DONE
within the deadline raises TimeoutError, and one whose digests differ RuntimeError.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from tests.cluster.processes import Cluster, cluster_database

import mycelia
from benches.cluster.harness import (
    CPU_COLUMN,
    ENTITIES,
    FIELDS,
    Cell,
    Doc,
    Meter,
    Worker,
    connect_clients,
    cpu_cell,
    cpu_seconds,
    emit,
    progress,
    rss,
    say,
)
from benches.harness import Table
from benches.peers.harness import parse_key, peer_module
from mycelia import EntityId, Node
from mycelia.node.live import LiveQuery


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
