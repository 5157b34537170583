"""The peer workloads (``../shared/peers/README.md``), run on Mycelia beside the peer itself.

The peer is pycrdt + pycrdt-websocket + SQLite (``../shared/peers/pycrdt_ws_bench.py``),
run in its own venv in the same sitting (``--peer-python``); the ratio to its figure is
the measure, since absolute figures move from machine to machine. The generators are
imported from the peer script itself (standard library only), and the definitions are
followed literally: 1,000 entities x 10 fields, one edit per transaction.

Mycelia's server is a real ``mycelia serve`` process on LMDB (fsync on every commit
group); the client is an ephemeral node in this process with a live query open over the
entities (as an app showing them would), so ``trx.edit`` reads locally.

- **W4 sequential**: 1,000 field sets, each awaited until the server made it durable
  (``async with ctx.transaction()``, the default wait).
- **W4 pipelined**: 1,000 more with ``wait="local"``, timed until the last is confirmed.
- **W4 after kill -9**: the server is killed right after the last confirmation, restarted
  on the same files, and a fresh client must find every edit.

Run: ``python -m benches.bench_peers --peer-python PEER_VENV/bin/python``
(``--runs N``; ``--baseline-src DIR`` also times the sequential case on another checkout's
``src``, e.g. the commit before a change, for "no slower than today").
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import mycelia
from benches.harness import Table
from mycelia import EntityId, Model, Node
from mycelia.storage import MemoryStorage

PEERS = Path(__file__).resolve().parents[2] / "shared" / "peers"
PEER_SCRIPT = PEERS / "pycrdt_ws_bench.py"
ENTITIES = 1000
FIELDS = 10
EDITS = 1000


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
        sys.executable, "-m", "mycelia.cli", "serve", "--data", str(data), "--port", str(port),
        stdout=asyncio.subprocess.PIPE, stderr=log, env=env,
    )  # fmt: skip
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 60)
    if b"listening on" not in line and b"ws://" not in line:
        raise RuntimeError(f"mycelia serve did not start: {line!r}")
    return process


def parse_key(key: str) -> tuple[int, str]:
    """``e12.f3`` → (12, ``f3``)."""
    entity, fieldno = key.split(".")
    return int(entity.removeprefix("e")), fieldno


async def client(url: str) -> Node:
    node = await Node.open(MemoryStorage(), durable=False)
    await mycelia.connect(node, url, max_backoff=0.2)
    await node.wait_ready(timeout=30)
    return node


async def w4_once(run: int, peer: ModuleType, workdir: Path) -> dict[str, float]:
    """One W4 run; returns its figures (rates per second, and keys missing after the kill)."""
    edits = peer.entity_edits(peer.SEED + 4 + run, 2 * EDITS, ENTITIES, FIELDS)
    data, port = workdir / f"w4-{run}", free_port()
    server = await serve(data, port)
    url = f"ws://127.0.0.1:{port}"
    node = await client(url)
    try:
        async with node.context().transaction() as trx:  # the entities, before the clock
            ids = [trx.create(Fields).id for _ in range(ENTITIES)]
        live = await node.context().query(Fields, "").__aenter__()
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
        await asyncio.gather(*(trx.confirmed() for trx in pending))
        pipelined = time.perf_counter() - t0
        await live.close()
    finally:
        server.kill()  # right after the last confirmation: a crash, not a clean stop
        await server.wait()
        await node.close()
    server = await serve(data, port)
    try:
        fresh = await client(url)
        rows = {v.id: v for v in await fresh.context().fetch(Fields, "")}
        missing = sum(
            1
            for key, value in expected.items()
            if getattr(rows[ids[parse_key(key)[0]]], parse_key(key)[1]) != value
        )
        await fresh.close()
    finally:
        server.kill()
        await server.wait()
    return {"seq": EDITS / sequential, "pipe": EDITS / pipelined, "missing": float(missing)}


async def _set(
    node: Node, ids: Sequence[EntityId], key: str, value: str, *, wait: str
) -> mycelia.Transaction:
    entity, fieldno = parse_key(key)
    trx = node.context().transaction(wait=wait)  # type: ignore[arg-type]
    async with trx:
        setattr(await trx.edit(Fields, ids[entity]), fieldno, value)
    return trx


SEQUENTIAL_ONLY = """
import asyncio, sys, time
sys.path.insert(0, sys.argv[1])
from benches.bench_peers import peer_module, serve, client, Fields, EDITS, ENTITIES, FIELDS
from benches.bench_peers import free_port, parse_key
from pathlib import Path

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


def peer_figures(python: str, runs: int, workdir: Path) -> dict[str, float]:
    """The peer's W4 medians from its own script, run now in its own venv."""
    out = workdir / "peer.json"
    subprocess.run(
        [python, str(PEER_SCRIPT), "--only", "W4", "--runs", str(runs), "--json", str(out),
         "--workdir", str(workdir / "peer")],
        check=True, capture_output=True, timeout=1800,
    )  # fmt: skip
    metrics = json.loads(out.read_text())["metrics"]
    by_name = {m["name"]: m["median"] for m in metrics if m["workload"] == "W4"}
    seq = next(v for k, v in by_name.items() if k.startswith(f"{EDITS:,} sequential"))
    pipe = next(v for k, v in by_name.items() if k.startswith(f"{EDITS:,} pipelined"))
    return {"seq": float(seq), "pipe": float(pipe)}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per side (medians)")
    parser.add_argument("--peer-python", help="the peer venv's python (skip the peer if unset)")
    parser.add_argument("--baseline-src", type=Path, help="another checkout's src/ to compare")
    args = parser.parse_args(list(argv) if argv is not None else sys.argv[1:])
    peer = peer_module()
    with tempfile.TemporaryDirectory(prefix="mycelia-peers-") as tmp:
        workdir = Path(tmp)
        theirs = peer_figures(args.peer_python, args.runs, workdir) if args.peer_python else {}
        runs = [asyncio.run(w4_once(i, peer, workdir)) for i in range(args.runs)]
        base = (
            baseline_sequential(args.baseline_src, args.runs, workdir)
            if args.baseline_src
            else None
        )
    ours = {k: statistics.median(r[k] for r in runs) for k in ("seq", "pipe", "missing")}

    def ratio(k: str) -> str:
        return f"{ours[k] / theirs[k]:.2f}x" if theirs else "(no peer run)"

    rows = [
        ["W4 sequential, each awaited until durable", f"{theirs.get('seq', 0):,.0f}/s",
         f"{ours['seq']:,.0f}/s", ratio("seq"), ">= 2x (real-time issue)"],
        ["W4 pipelined until the last is confirmed", f"{theirs.get('pipe', 0):,.0f}/s",
         f"{ours['pipe']:,.0f}/s", ratio("pipe"), ">= 8x"],
        ["W4 keys missing after kill -9", "0", f"{ours['missing']:.0f}", "", "0"],
    ]  # fmt: skip
    if base is not None:
        rows.append(
            ["W4 sequential on the baseline checkout", "", f"{base:,.0f}/s",
             f"{ours['seq'] / base:.2f}x of it", "no slower (>= ~0.9x, noise)"]
        )  # fmt: skip
    Table(
        f"Peer workload W4 ({args.runs} runs each, medians; peer = pycrdt-websocket + SQLite)",
        ["case", "peer", "mycelia", "ratio", "target"],
        rows,
    ).print()


if __name__ == "__main__":
    main()
