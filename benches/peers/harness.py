"""What every peer workload stands on: sizes, models, a ``mycelia serve`` process, clients.

The peer's generators come from its own script (:func:`peer_module`, standard library
only), so both sides replay the same seeds and sizes. An entity field ``e<e>.f<f>`` of the
peer's one shared Map is field ``f<f>`` of the ``e``-th :class:`Fields` entity
(:func:`parse_key`); the peer's root Text is the ``body`` of one :class:`Doc`. A
:class:`Server` is a real ``mycelia serve`` process on LMDB, read through /proc and its
``/metrics``, and killed with SIGKILL (a crash, not a clean stop). A client is an
ephemeral node on MemoryStorage; a :class:`Mirror` keeps a live query open over what it
works on, so ``trx.edit`` reads locally. Every wait is bounded (:func:`within`, ``TIMEOUT``)
and names what it waited for. :func:`repeat` runs one warm-up (discarded) and then the
measured runs, each after a full garbage collection outside the clock.

``benches.bench_peers`` re-exports the names its baseline script imports from it.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import os
import re
import socket
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import mycelia
from mycelia import EntityId, Model, Node, Text
from mycelia.storage import MemoryStorage

PEERS = Path(__file__).resolve().parents[3] / "shared" / "peers"
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
    w5_trace_ops: int = 50_000


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
    the last change set was read (``peer.monotonic``: one clock for all processes), and
    with ``track_cpu`` (W3 only) ``cpu_at`` the process CPU then: a system call per change
    set, which the peer's change callbacks do not make either.
    """

    def __init__(
        self, live: Any, on_view: Callable[[Any], None] | None = None, *, track_cpu: bool = False
    ) -> None:
        self.live = live
        self.track_cpu = track_cpu
        self.views: dict[EntityId, Any] = {v.id: v for v in live.items}
        self.on_view = on_view
        self.on_change: Callable[[], None] | None = None
        self.changed_at = time.clock_gettime(time.CLOCK_MONOTONIC)
        self.cpu_at = 0.0
        self._grown: tuple[int, asyncio.Future[None]] | None = None
        self._task = asyncio.create_task(self._follow())

    @classmethod
    async def open(
        cls,
        node: Node,
        model: type[Model],
        on_view: Callable[[Any], None] | None = None,
        *,
        track_cpu: bool = False,
    ) -> Mirror:
        live = await node.context().query(model, "").__aenter__()
        return cls(live, on_view, track_cpu=track_cpu)

    async def _follow(self) -> None:
        async for changes in self.live:
            for view in changes.initial + changes.added + changes.updated:
                self.views[view.id] = view
                if self.on_view is not None:
                    self.on_view(view)
            for view in changes.removed:
                self.views.pop(view.id, None)
            self.changed_at = time.clock_gettime(time.CLOCK_MONOTONIC)
            if self.track_cpu:
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


async def set_field(
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
