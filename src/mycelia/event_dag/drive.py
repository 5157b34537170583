"""The thin async driver: answer a :class:`Comparison` from an event source.

The only ``async`` code in this layer (STYLE.md §1): it loops ``wanted`` → ``get_events``
→ ``feed`` and escalates the budget once (to 4x) before reporting ``BudgetExceeded``.
:func:`compare_with` does the same synchronously from a mapping (tests, benchmarks).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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
    escalated = False
    while True:
        if cmp.status is Status.WANTS:
            cmp.feed(await events.get_events(cmp.wanted, ahead=cmp.read_ahead))
        elif cmp.status is Status.OVER_BUDGET and not escalated and budget > 0:
            escalated = True
            cmp.extend_budget(budget * (ESCALATION - 1))
        else:
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
    escalated = False
    while True:
        if cmp.status is Status.WANTS:
            cmp.feed({i: events[i] for i in cmp.wanted if i in events})
        elif cmp.status is Status.OVER_BUDGET and not escalated and budget > 0:
            escalated = True
            cmp.extend_budget(budget * (ESCALATION - 1))
        else:
            return cmp.result()
