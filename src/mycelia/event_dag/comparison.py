"""The comparison of two clocks: a sans-I/O walk ordered by generation (ARCHITECTURE.md §4).

How it works. Every event has a *generation*: 1 for a genesis, else 1 + the largest
generation of its parents, so an ancestor always has a smaller generation than its
descendants. The walk keeps a priority queue of ids by generation, each carrying flags:
``S`` (reached from the subject), ``O`` (reached from the other clock) and ``STALE``
(strictly below an event reached from both). It pops every id of the highest generation
at once (they cannot be ancestors of one another), pushes each one's parents with its
flags — plus ``STALE`` below a common event — and asks for the parents it has not seen,
all in one batch: one getter call per frontier step.

Because every child of an id has a higher generation, an id's flags are complete when it is
popped. So an id popped with ``S`` and ``O`` but not ``STALE`` is a *maximal* common
ancestor (a member of the meet), one popped with only ``S`` is in ``A(S) \\ A(O)``, and the
walk can stop as soon as every queued id is ``STALE``: nothing below can change the
verdict. The cost is the number of events since the fork (the two side-only regions plus
the meet), not the length of the history — git's merge-base with generation numbers.

Missing events. An id the getter does not know is placed at generation 0 (after every
known event, so its flags are complete), or at its hinted generation when the caller knows
it (an ephemeral node's snapshot head). Popped with both sides' flags it is a common
ancestor beyond local storage; popped with one side's flags it makes the comparison fail
with :class:`~mycelia.errors.EventNotFound` — the verdict would depend on what it hides.

Budget. Each fetched event costs one unit. When the walk needs to fetch beyond its budget
it stops in :attr:`Status.OVER_BUDGET` without a verdict; :meth:`Comparison.extend_budget`
resumes the same walk (nothing is re-fetched), and :class:`BudgetExceeded` is only ever
reported, never mistaken for a verdict.

Trivial cases: equal clocks are ``Equal`` without fetching anything; one empty clock
gives ``DivergedSince`` with an empty meet.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from heapq import heappop, heappush
from typing import Final

from mycelia.errors import EventNotFound, LineageError
from mycelia.event_dag.relation import (
    Ahead,
    BudgetExceeded,
    Disjoint,
    DivergedSince,
    Equal,
    Relation,
    StrictAscends,
    StrictDescends,
)
from mycelia.proto import EMPTY_CLOCK, AdmittedEvent, Clock, EventId

__all__ = ["DEFAULT_BUDGET", "Comparison", "ComparisonResult", "Layer", "Status"]

DEFAULT_BUDGET: Final = 100_000
"""Events one comparison may fetch before it stops (the driver escalates once, 4x)."""

_MAX_READ_AHEAD: Final = 4096
_S: Final = 1
_O: Final = 2
_BOTH: Final = 3
_STALE: Final = 4


class Status(enum.Enum):
    """Where a :class:`Comparison` stands."""

    WANTS = "wants"
    """It needs the events in :attr:`Comparison.wanted`; call :meth:`Comparison.feed`."""
    OVER_BUDGET = "over budget"
    """It needs more events than its budget allows: extend it, or take the result."""
    DONE = "done"
    """It has a verdict: call :meth:`Comparison.result`."""


@dataclass(frozen=True, slots=True)
class Layer:
    """One generation of the events between the meet and the heads, parents before children.

    ``to_apply`` are the subject's events the other side lacks; ``already_applied`` are the
    other side's events the subject lacks. Events in one layer are mutually concurrent.
    """

    generation: int
    to_apply: tuple[AdmittedEvent, ...]
    already_applied: tuple[AdmittedEvent, ...]


@dataclass(frozen=True, slots=True)
class ComparisonResult:
    """A verdict plus the part of the DAG the walk discovered (the accumulator)."""

    relation: Relation
    subject_only: tuple[AdmittedEvent, ...]
    """Events in ``A(subject) \\ A(other)``, parents first (by generation, then id)."""
    other_only: tuple[AdmittedEvent, ...]
    """Events in ``A(other) \\ A(subject)``, parents first."""
    merged_head: Mapping[EventId, int]
    """The maximal ids of subject and other together, with generations: the head after a merge."""
    events: Mapping[EventId, AdmittedEvent] = field(repr=False)
    """Every event the walk fetched or was given."""
    fetched: int = 0
    """Events fetched (budget units spent)."""
    steps: int = 0
    """Getter calls made (frontier steps)."""

    def into_layers(self) -> list[Layer]:
        """The events since the meet by generation, parents first (diverged results only).

        Raises:
            LineageError: the result is not :class:`DivergedSince` or
                :class:`StrictDescends` (layers from a truncated walk would be wrong).
        """
        if not isinstance(self.relation, (DivergedSince, StrictDescends, Ahead)):
            raise LineageError(f"no layers for a {type(self.relation).__name__} result")
        by_gen: dict[int, tuple[list[AdmittedEvent], list[AdmittedEvent]]] = {}
        for e in self.subject_only:
            by_gen.setdefault(e.generation, ([], []))[0].append(e)
        for e in self.other_only:
            by_gen.setdefault(e.generation, ([], []))[1].append(e)
        return [Layer(g, tuple(a), tuple(b)) for g, (a, b) in sorted(by_gen.items())]


class Comparison:
    """A resumable comparison: it asks for ids (:attr:`wanted`) and is fed events (:meth:`feed`).

    Build one with :meth:`start`; drive it with :func:`~mycelia.event_dag.compare` or any
    loop that answers :attr:`wanted` until :attr:`status` is not ``WANTS``.
    """

    __slots__ = (
        "_blind",
        "_budget",
        "_fetched",
        "_flags",
        "_heap",
        "_hints",
        "_meet",
        "_missing",
        "_nodes",
        "_nonstale",
        "_o_only",
        "_o_roots",
        "_other",
        "_pending",
        "_popped",
        "_relation",
        "_s_only",
        "_s_roots",
        "_status",
        "_steps",
        "_strict",
        "_subject",
        "_subject_open",
        "_subject_side",
        "_wanted",
    )

    def __init__(
        self, subject: Clock, other: Clock, budget: int, hints: Mapping[EventId, int]
    ) -> None:
        self._subject = subject
        self._other = other
        self._budget = budget
        self._hints = hints
        self._flags: dict[EventId, int] = {}
        self._strict: set[EventId] = set()
        self._nodes: dict[EventId, AdmittedEvent] = {}
        self._heap: list[tuple[int, EventId]] = []
        self._pending: set[EventId] = set()
        self._popped: set[EventId] = set()
        self._missing: set[EventId] = set()
        self._blind: set[EventId] = set()
        """Unavailable ids with no hinted generation (walked last, at generation 0)."""
        self._nonstale = 0
        self._subject_open = 0  # queued ids reached from the subject only
        self._subject_side = False  # stop once no subject-only id is left (missing())
        self._fetched = 0
        self._steps = 0
        self._meet: list[EventId] = []
        self._s_only: list[EventId] = []
        self._o_only: list[EventId] = []
        self._s_roots: list[EventId] = []
        self._o_roots: list[EventId] = []
        self._wanted: tuple[EventId, ...] = ()
        self._relation: Relation | None = None
        self._status = Status.WANTS

    @classmethod
    def start(
        cls,
        subject: Clock,
        other: Clock,
        *,
        budget: int = DEFAULT_BUDGET,
        hints: Mapping[EventId, int] | None = None,
        known: Iterable[AdmittedEvent] = (),
        subject_side: bool = False,
    ) -> Comparison:
        """Begin comparing ``subject`` with ``other``.

        Args:
            budget: events the walk may fetch before it stops in ``OVER_BUDGET``.
            hints: generations of ids that may be unavailable as events (a snapshot head).
            known: events the caller already holds (they cost no fetch).
            subject_side: stop as soon as every event of ``A(subject) minus A(other)`` is
                found (``subject_only`` exact, relation ``Ahead`` or ``StrictAscends``).
                Enough for an applier, and it does not walk the other side's branches.
        """
        cmp = cls(subject, other, budget, hints or {})
        cmp._subject_side = subject_side
        for event in known:
            cmp._nodes[event.id] = event
        if subject == other:
            cmp._finish(Equal())
        elif not subject or not other:
            cmp._finish(DivergedSince(EMPTY_CLOCK))
        else:
            for eid in subject:
                cmp._mark(eid, _S)
            for eid in other:
                cmp._mark(eid, _O)
            cmp._advance()
        return cmp

    @property
    def status(self) -> Status:
        """Whether it wants events, is over budget, or is done."""
        return self._status

    @property
    def read_ahead(self) -> int:
        """How many ancestors of :attr:`wanted` a getter is invited to add to its answer.

        Zero for the first steps (most comparisons end there); then it grows with each
        step, so a long walk costs a logarithmic number of calls.
        """
        steps = self._steps
        return 0 if steps < 2 else min(16 << steps, _MAX_READ_AHEAD)

    @property
    def wanted(self) -> tuple[EventId, ...]:
        """The ids to fetch next (ascending; empty unless :attr:`status` is ``WANTS``)."""
        return self._wanted if self._status is Status.WANTS else ()

    def feed(self, found: Mapping[EventId, AdmittedEvent]) -> None:
        """Supply the events asked for (absent ids are unknown to the getter).

        Extra events (ancestors a getter read ahead) are kept and save later fetches.
        """
        if self._status is not Status.WANTS:
            raise LineageError(f"a comparison in state {self._status.value} takes no events")
        self._steps += 1
        nodes = self._nodes
        for eid, event in found.items():
            if eid not in nodes and event.id == eid:
                nodes[eid] = event
        for eid in self._wanted:
            if eid in found:
                self._fetched += 1
            self._enqueue(eid)
        self._pending.clear()
        self._wanted = ()
        self._advance()

    def extend_budget(self, extra: int) -> None:
        """Allow ``extra`` more fetches and resume an ``OVER_BUDGET`` walk where it stopped."""
        self._budget += extra
        if self._status is Status.OVER_BUDGET:
            self._status = Status.WANTS
            self._advance()

    def result(self) -> ComparisonResult:
        """The verdict (``BudgetExceeded`` if called while over budget).

        Raises:
            EventNotFound: an event only one side reaches is unavailable.
            LineageError: the comparison still wants events.
        """
        if self._status is Status.WANTS:
            raise LineageError("the comparison is not finished: feed it the wanted events")
        relation = self._relation
        if self._status is Status.OVER_BUDGET:
            frontier = tuple(sorted(self._pending))
            relation = BudgetExceeded(self._budget, frontier)
        assert relation is not None
        nodes = self._nodes
        return ComparisonResult(
            relation,
            tuple(nodes[i] for i in _by_generation(self._s_only, nodes)),
            tuple(nodes[i] for i in _by_generation(self._o_only, nodes)),
            self._merged_head(),
            nodes,
            self._fetched,
            self._steps,
        )

    # -- the walk ------------------------------------------------------------------------

    def _mark(self, eid: EventId, flags: int) -> None:
        """Add ``flags`` to ``eid``, queueing it the first time it is reached."""
        old = self._flags.get(eid, 0)
        new = old | flags
        if new == old:
            return
        if eid in self._popped:
            # Only possible if a generation is wrong (a parent at or above its child).
            raise LineageError(f"inconsistent generations around {eid}")
        self._flags[eid] = new
        if not old:
            self._pending.add(eid)
            if not new & _STALE:
                self._nonstale += 1
        elif new & _STALE and not old & _STALE:
            self._nonstale -= 1
        if new == _S and old != _S:
            self._subject_open += 1
        elif old == _S:
            self._subject_open -= 1

    def _enqueue(self, eid: EventId) -> None:
        node = self._nodes.get(eid)
        if node is not None:
            generation = node.generation
        elif eid in self._hints:
            generation = self._hints[eid]
            self._missing.add(eid)
        else:
            generation = 0
            self._missing.add(eid)
            self._blind.add(eid)
        heappush(self._heap, (-generation, eid))

    def _advance(self) -> None:
        """Walk as far as the known events allow; then ask, stop, or conclude."""
        heap, pending, nodes = self._heap, self._pending, self._nodes
        while True:
            if self._nonstale == 0 or (
                self._subject_side and self._subject_open == 0 and not self._blind_other()
            ):
                self._conclude()
                return
            if pending:
                if len(pending) == 1 and not heap:
                    # A chain: the only frontier id is the parent just reached. If it is
                    # cached, expand it at once (no heap round trip, no fetch).
                    (eid,) = pending
                    if eid in nodes:
                        pending.clear()
                        self._expand(eid)
                        continue
                for eid in [e for e in pending if e in nodes]:
                    pending.discard(eid)
                    heappush(heap, (-nodes[eid].generation, eid))
                if pending:
                    if self._fetched >= self._budget:
                        self._status = Status.OVER_BUDGET
                    else:
                        self._wanted = tuple(sorted(pending))
                    return
            if not heap:
                self._conclude()
                return
            top = heap[0][0]
            eid = heappop(heap)[1]
            self._expand(eid)
            while heap and heap[0][0] == top:  # the rest of this generation
                self._expand(heappop(heap)[1])

    def _expand(self, eid: EventId) -> None:
        """Pop ``eid``: classify it by its (now complete) flags and push them to its parents."""
        flags = self._flags[eid]
        self._popped.add(eid)
        if flags & _BOTH == _BOTH:
            if not flags & _STALE:
                self._nonstale -= 1
                self._meet.append(eid)
            down = flags | _STALE
        else:
            self._nonstale -= 1
            if flags == _S:
                self._s_only.append(eid)
                self._subject_open -= 1
            else:
                self._o_only.append(eid)
            down = flags
        node = self._nodes.get(eid)
        if node is None:
            if flags & _BOTH != _BOTH:
                side = "subject" if flags == _S else "other clock"
                raise EventNotFound(
                    f"event {eid} (reached only from the {side}) is not available",
                    event_id=eid,
                )
            return
        parents = node.event.parent.ids
        if not parents:
            if flags == _S:
                self._s_roots.append(eid)
            elif flags == _O:
                self._o_roots.append(eid)
            return
        strict, mark = self._strict, self._mark
        for parent in parents:
            strict.add(parent)
            mark(parent, down)

    def _blind_other(self) -> bool:
        """Whether an unavailable id of unknown generation, reached from the other clock
        only, is still queued: walked at generation 0, it could be above subject events
        already classified (it may link them to the other clock), so a subject-side walk
        may not stop early while one is (the full walk then names it in EventNotFound)."""
        flags, popped = self._flags, self._popped
        return any(i not in popped and flags.get(i) == _O for i in self._blind)

    def _conclude(self) -> None:
        if self._subject_side:
            self._finish(Ahead() if self._s_only else StrictAscends())
            return
        if not self._o_only and not self._s_roots:
            self._finish(StrictDescends())
        elif not self._s_only:
            self._finish(StrictAscends())
        elif not self._meet:
            self._finish(Disjoint(Clock(self._s_roots), Clock(self._o_roots)))
        elif self._some_other_head_shares_nothing():
            self._finish(DivergedSince(EMPTY_CLOCK))
        else:
            self._finish(DivergedSince(Clock(self._meet)))

    def _finish(self, relation: Relation) -> None:
        self._relation = relation
        self._status = Status.DONE
        self._wanted = ()

    def _some_other_head_shares_nothing(self) -> bool:
        """Whether a head of the other clock has no ancestor reached from the subject."""
        flags, nodes = self._flags, self._nodes
        dead: set[EventId] = set()  # explored completely, and no subject flag below

        def reaches_subject(start: EventId) -> bool:
            stack, seen = [start], {start}
            while stack:
                eid = stack.pop()
                if flags.get(eid, 0) & _S:
                    return True
                node = nodes.get(eid)
                for parent in node.event.parent if node is not None else ():
                    if parent not in seen and parent not in dead:
                        seen.add(parent)
                        stack.append(parent)
            dead.update(seen)  # a failed search explored every ancestor: all are dead
            return False

        return not all(reaches_subject(h) for h in self._other)

    def _merged_head(self) -> dict[EventId, int]:
        if self._relation is None or isinstance(self._relation, BudgetExceeded):
            return {}
        nodes, hints = self._nodes, self._hints
        head: dict[EventId, int] = {}
        for eid in (*self._subject, *self._other):
            if eid in self._strict:
                continue
            node = nodes.get(eid)
            head[eid] = node.generation if node is not None else hints.get(eid, 0)
        return head


def _by_generation(ids: list[EventId], nodes: Mapping[EventId, AdmittedEvent]) -> list[EventId]:
    return sorted((i for i in ids if i in nodes), key=lambda i: (nodes[i].generation, i))
