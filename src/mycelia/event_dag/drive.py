"""The thin async driver: answer a :class:`Comparison` from an event source.

The only ``async`` code in this layer (STYLE.md §1): it loops ``wanted`` → ``get_events``
→ ``feed`` and escalates the budget once (to 4x) before reporting ``BudgetExceeded``.
:func:`compare_with` does the same synchronously from a mapping (tests, benchmarks).
Both answer the rounds of one loop, :func:`_rounds`, which alone decides when to fetch,
when to escalate and when to stop, so the two drivers cannot disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Final

from mycelia.event_dag.comparison import DEFAULT_BUDGET, Comparison, ComparisonResult, Status
from mycelia.proto import AdmittedEvent, Clock, EventId
from mycelia.retrieval import EventSource

__all__ = ["ESCALATION", "compare", "compare_with", "missing"]

ESCALATION: Final = 4
"""A walk over budget is resumed once with its budget raised to this multiple."""


async def compare(
    events: EventSource,
    subject: Clock,
    other: Clock,
    *,
    budget: int = DEFAULT_BUDGET,
    hints: Mapping[EventId, int] | None = None,
    known: Iterable[AdmittedEvent] = (),
    subject_side: bool = False,
) -> ComparisonResult:
    """Compare ``subject`` with ``other``, reading events from ``events`` in batches.

    Returns the result; its relation is ``BudgetExceeded`` only if the walk needed more
    than ``ESCALATION * budget`` events. Raises EventNotFound when an event that only one
    side reaches is unavailable.
    """
    cmp = Comparison.start(
        subject, other, budget=budget, hints=hints, known=known, subject_side=subject_side
    )
    for wanted in _rounds(cmp, budget):
        cmp.feed(await events.get_events(wanted, ahead=cmp.read_ahead))
    return cmp.result()


async def missing(
    events: EventSource,
    subject: Clock,
    other: Clock,
    *,
    budget: int = DEFAULT_BUDGET,
    hints: Mapping[EventId, int] | None = None,
    known: Iterable[AdmittedEvent] = (),
) -> ComparisonResult:
    """The events of ``A(subject) \\ A(other)``, parents first, and nothing more.

    A subject-side walk: it stops as soon as they are all found, without walking the other
    clock's own branches (what an applier needs; see :class:`Comparison`'s
    ``subject_side``). The relation is ``Ahead``, ``StrictAscends`` (nothing missing) or
    ``BudgetExceeded``.
    """
    return await compare(
        events, subject, other, budget=budget, hints=hints, known=known, subject_side=True
    )


def compare_with(
    events: Mapping[EventId, AdmittedEvent],
    subject: Clock,
    other: Clock,
    *,
    budget: int = DEFAULT_BUDGET,
    hints: Mapping[EventId, int] | None = None,
) -> ComparisonResult:
    """:func:`compare`, synchronously, over an in-memory mapping of events."""
    cmp = Comparison.start(subject, other, budget=budget, hints=hints)
    for wanted in _rounds(cmp, budget):
        cmp.feed({i: events[i] for i in wanted if i in events})
    return cmp.result()


def _rounds(cmp: Comparison, budget: int) -> Iterator[tuple[EventId, ...]]:
    """The ids ``cmp`` wants, one batch per round; the caller feeds each before the next.

    An over-budget walk is resumed once with ``ESCALATION`` times its ``budget``; the
    iterator ends when the walk is done or over budget again (then ``cmp.result()``
    reports ``BudgetExceeded``).
    """
    escalated = False
    while True:
        if cmp.status is Status.WANTS:
            yield cmp.wanted
        elif cmp.status is Status.OVER_BUDGET and not escalated and budget > 0:
            escalated = True
            cmp.extend_budget(budget * (ESCALATION - 1))
        else:
            return
