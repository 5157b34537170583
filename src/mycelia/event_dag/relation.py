"""The relation between two clocks, as the comparison reports it (ARCHITECTURE.md §4).

Writing ``A(c)`` for the inclusive ancestry of clock ``c``, for a subject ``S`` and another
clock ``O``, the verdicts are checked in this order:

- :class:`Equal`: ``S`` and ``O`` are the same set of ids.
- :class:`StrictDescends`: ``A(O) ⊆ A(S)`` and every root (genesis) in ``A(S)`` is in
  ``A(O)`` — the subject extends the other clock and smuggles in no foreign lineage.
- :class:`StrictAscends`: ``A(S) ⊆ A(O)`` (the subject is already history).
- :class:`Disjoint`: ``A(S) ∩ A(O) = ∅``.
- :class:`DivergedSince` with an empty meet: some head of ``O`` shares no history with
  ``S`` (conservative: nothing of ``O`` can be assumed covered).
- :class:`DivergedSince`: otherwise; ``meet`` is the maximal antichain of
  ``A(S) ∩ A(O)``.
- :class:`BudgetExceeded`: the walk stopped at its budget before any of the above could be
  decided. It is never a verdict about the DAG.

Either clock empty (but not both) is ``DivergedSince`` with an empty meet.
"""

from __future__ import annotations

from dataclasses import dataclass

from mycelia.proto import Clock, EventId

__all__ = [
    "Ahead",
    "BudgetExceeded",
    "Disjoint",
    "DivergedSince",
    "Equal",
    "Relation",
    "StrictAscends",
    "StrictDescends",
]


@dataclass(frozen=True, slots=True)
class Equal:
    """The two clocks hold the same ids."""


@dataclass(frozen=True, slots=True)
class StrictDescends:
    """The subject strictly extends the other clock (apply what it has beyond it)."""


@dataclass(frozen=True, slots=True)
class StrictAscends:
    """The subject is already in the other clock's history (nothing to do)."""


@dataclass(frozen=True, slots=True)
class DivergedSince:
    """The clocks are concurrent since ``meet`` (empty: conservatively, no common point)."""

    meet: Clock


@dataclass(frozen=True, slots=True)
class Disjoint:
    """The clocks share no history; ``subject_roots`` and ``other_roots`` are their geneses."""

    subject_roots: Clock
    other_roots: Clock


@dataclass(frozen=True, slots=True)
class Ahead:
    """Only from a subject-side walk (:func:`~mycelia.event_dag.missing`): the subject holds
    events the other clock lacks. It says nothing more (the walk stopped as soon as it had
    found all of them)."""


@dataclass(frozen=True, slots=True)
class BudgetExceeded:
    """The walk stopped after fetching ``budget`` events, with ``frontier`` still to visit."""

    budget: int
    frontier: tuple[EventId, ...]


Relation = (
    Equal | StrictDescends | StrictAscends | DivergedSince | Disjoint | Ahead | BudgetExceeded
)
