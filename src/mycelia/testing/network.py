"""Virtual time and the faulty network between simulated nodes.

- :class:`VirtualClock` is the only time the simulator knows: integer ticks that only the
  simulator advances. Nothing here reads a wall clock or sleeps.
- :class:`Network` carries byte payloads between node indices. Each send draws its fate
  from the seeded ``rng`` in a fixed order: cut by a partition, dropped, duplicated, each
  copy delayed by 1..``max_delay`` ticks (different delays reorder messages, also on one
  link) and possibly corrupted (truncated, so the receiver's decoder must refuse it).
  Partitions are also checked at delivery: a message in flight when the link is cut is lost.
- :class:`Faults` holds every fault rate; the link rates apply here, the node faults are
  drawn as actions by :mod:`mycelia.testing.actions`.

Invariant: given the same seed and the same calls, the same messages are delivered at the
same ticks in the same order (ties broken by send order), and every fate is recorded in
the trace.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from mycelia.testing.trace import Trace

__all__ = ["INTRUDER", "Envelope", "Faults", "Network", "VirtualClock"]

INTRUDER = -1
"""The sender index of messages injected from outside the simulated system."""


@dataclass(frozen=True, slots=True)
class Faults:
    """Fault rates. Link faults apply per message; node faults weigh actions in a plan."""

    drop: float = 0.0
    """Probability that a message is lost."""
    duplicate: float = 0.0
    """Probability that a message is delivered twice (each copy with its own delay)."""
    corrupt: float = 0.0
    """Probability that a copy arrives truncated (the receiver must refuse it)."""
    max_delay: int = 1
    """Messages take 1..max_delay ticks; more than 1 reorders them."""
    partition: float = 0.0
    """Weight of partition actions (a group of nodes cut off, healed after a while)."""
    crash: float = 0.0
    """Weight of crash actions (a node stops, and restarts later)."""
    write_failure: float = 0.0
    """Weight of actions that make a node's next storage write fail."""
    foreign: float = 0.0
    """Weight of actions that replay another system's events to a node."""

    @classmethod
    def none(cls) -> Faults:
        """A reliable, in-order network and no node faults."""
        return cls()

    @classmethod
    def all(cls) -> Faults:
        """Every fault enabled, at rates that still let a 200-operation run make progress."""
        return cls(
            drop=0.08,
            duplicate=0.08,
            corrupt=0.02,
            max_delay=6,
            partition=0.03,
            crash=0.03,
            write_failure=0.02,
            foreign=0.015,
        )

    def links_only(self) -> Faults:
        """These link faults, without node faults."""
        return Faults(
            drop=self.drop,
            duplicate=self.duplicate,
            corrupt=self.corrupt,
            max_delay=self.max_delay,
        )


class VirtualClock:
    """Simulated time, in ticks."""

    def __init__(self) -> None:
        self.now = 0

    def advance(self, ticks: int = 1) -> int:
        """Move time forward; returns the new time."""
        self.now += ticks
        return self.now


@dataclass(frozen=True, slots=True, order=True)
class Envelope:
    """One message on the wire."""

    at: int
    """The tick it is delivered at."""
    seq: int
    """Send order (breaks ties between messages due at the same tick)."""
    src: int = field(compare=False)
    dst: int = field(compare=False)
    payload: bytes = field(compare=False)
    corrupted: bool = field(compare=False, default=False)


class Network:
    """Messages in flight between node indices; see the module docstring."""

    def __init__(self, clock: VirtualClock, rng: random.Random, faults: Faults, trace: Trace):
        self.clock = clock
        self.faults = faults
        self._rng = rng
        self._trace = trace
        self._queue: list[Envelope] = []
        self._seq = 0
        self._side: frozenset[int] = frozenset()
        self.counts: dict[str, int] = {}

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def send(self, src: int, dst: int, payload: bytes) -> None:
        """Put ``payload`` on the link ``src`` → ``dst`` (its fate drawn now)."""
        now, faults, rng = self.clock.now, self.faults, self._rng
        if self.cut(src, dst):
            self._trace.record("cut", now, src, dst, payload)
            self._count("cut")
            return
        if rng.random() < faults.drop:
            self._trace.record("drop", now, src, dst, payload)
            self._count("dropped")
            return
        copies = 2 if rng.random() < faults.duplicate else 1
        if copies == 2:
            self._count("duplicated")
        for _ in range(copies):
            at = now + rng.randint(1, max(1, faults.max_delay))
            data, corrupted = payload, False
            if rng.random() < faults.corrupt:
                data, corrupted = payload[: rng.randrange(len(payload))], True
                self._count("corrupted")
            self._seq += 1
            heapq.heappush(self._queue, Envelope(at, self._seq, src, dst, data, corrupted))
            self._trace.record("send", now, src, dst, at, data)
            self._count("sent")

    def pop_due(self) -> Envelope | None:
        """The next message due by now (earliest first, then send order), if any."""
        if self._queue and self._queue[0].at <= self.clock.now:
            return heapq.heappop(self._queue)
        return None

    @property
    def in_flight(self) -> int:
        """Messages not delivered yet."""
        return len(self._queue)

    def partition(self, side: Iterable[int]) -> None:
        """Cut every link between ``side`` and the other nodes (replaces any partition)."""
        self._side = frozenset(side)
        self._trace.record("partition", self.clock.now, sorted(self._side))
        self._count("partitions")

    def heal(self) -> None:
        """Restore every link."""
        if self._side:
            self._trace.record("heal", self.clock.now)
        self._side = frozenset()

    def cut(self, a: int, b: int) -> bool:
        """Whether a partition separates ``a`` and ``b`` (an intruder is never cut off)."""
        if not self._side or a < 0 or b < 0:
            return False
        return (a in self._side) != (b in self._side)
