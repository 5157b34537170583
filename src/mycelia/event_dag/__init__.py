"""``mycelia.event_dag``: comparison of clocks, layers, and topological order.

Pure: it reads events only through a :class:`~mycelia.retrieval.EventSource`, and its core
(:class:`Comparison`) is a sans-I/O step object that asks for ids and is fed events.
"""

from mycelia.event_dag.comparison import (
    DEFAULT_BUDGET,
    Comparison,
    ComparisonResult,
    Layer,
    Status,
)
from mycelia.event_dag.drive import ESCALATION, compare, compare_with, missing
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
from mycelia.event_dag.toposort import topological_sort

__all__ = [
    "DEFAULT_BUDGET",
    "ESCALATION",
    "Ahead",
    "BudgetExceeded",
    "Comparison",
    "ComparisonResult",
    "Disjoint",
    "DivergedSince",
    "Equal",
    "Layer",
    "Relation",
    "Status",
    "StrictAscends",
    "StrictDescends",
    "compare",
    "compare_with",
    "missing",
    "topological_sort",
]
