"""What the cluster cases share: models, CPU and memory meters, client worker processes.

The models are W3's (:class:`Cell`, 100 entities × 5 fields, and one :class:`Doc` text)
and a :class:`Counter` for latency and scaling. CPU and memory are read from /proc (a
process's own CPU from getrusage): a :class:`Meter` splits the CPU used between its start
and stop into the servers', PostgreSQL's, the clients' (the workers report theirs) and
everyone else's on the machine, the noise a table admits to. A :class:`Worker` is a client
process (``python -m benches.bench_cluster --worker JOB``): it gets its job as one JSON
argument, then reads commands on stdin and reports ``KIND {json}`` lines on stdout
(:func:`emit`); its progress goes to stderr (:func:`say`). Client *c* prefers server *c*
mod *S* and fails over to the others (:func:`connect_clients`).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import mycelia
from mycelia import Model, Node, Text
from mycelia.storage import MemoryStorage

ROOT = Path(__file__).resolve().parents[2]
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


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
