"""What a comparison's verdict means for an entity's head (ARCHITECTURE.md §5).

:data:`VERDICTS` is the one table that decides whether staged events are applied,
ignored or refused; :func:`head_after` computes the head once the events the head lacked
are applied. :func:`extends_head` and :func:`above_head` are the two shapes where that head
is known without a comparison, in O(the events' parents) (ARCHITECTURE.md §4).
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Sequence
from typing import Final

from mycelia.errors import BudgetExceeded as BudgetExceededError
from mycelia.errors import Disjoint as DisjointError
from mycelia.errors import MyceliaError
from mycelia.event_dag import (
    Ahead,
    BudgetExceeded,
    Disjoint,
    DivergedSince,
    Equal,
    Relation,
    StrictAscends,
    StrictDescends,
)
from mycelia.proto import AdmittedEvent, EntityId, EventId

__all__ = [
    "VERDICTS",
    "Action",
    "above_boundary",
    "above_head",
    "action_for",
    "extends_head",
    "head_after",
    "rejection",
]


class Action(enum.Enum):
    """What the applier does with a verdict."""

    NOTHING = "nothing"
    """Every staged event is already in the head's history."""
    APPLY = "apply"
    """Apply the events the head lacks (``subject_only``), then take the merged head."""
    REJECT = "reject"
    """The events cannot be placed in this entity's history."""


VERDICTS: Final[Mapping[type[Relation], Action]] = {
    Ahead: Action.APPLY,
    Equal: Action.NOTHING,
    StrictAscends: Action.NOTHING,
    StrictDescends: Action.APPLY,
    DivergedSince: Action.APPLY,  # an empty meet is refused in _action below
    Disjoint: Action.REJECT,
    BudgetExceeded: Action.REJECT,
}
"""The verdict → action table: the one place that decides (ARCHITECTURE.md §5)."""


def head_after(head: Mapping[EventId, int], applied: list[AdmittedEvent]) -> dict[EventId, int]:
    """The head once ``applied`` (every event the head lacked, parents first) is applied.

    A tip of an antichain head can only be an ancestor of a new event as one of the new
    events' direct parents (it would otherwise be an ancestor of another tip), so the new
    head is the old tips that no new event names as a parent, plus the new events no other
    new event names.
    """
    named = {p for e in applied for p in e.parent}
    after = {tip: gen for tip, gen in head.items() if tip not in named}
    after.update((e.id, e.generation) for e in applied if e.id not in named)
    return after


def action_for(relation: Relation) -> Action:
    if isinstance(relation, DivergedSince) and not relation.meet:
        return Action.REJECT  # nothing in common with the head: not this entity's history
    return VERDICTS[type(relation)]


def rejection(relation: Relation, entity_id: EntityId) -> MyceliaError:
    if isinstance(relation, BudgetExceeded):
        return BudgetExceededError(
            f"placing events on entity {entity_id} needs more than {relation.budget} events "
            "of history to be walked"
        )
    return DisjointError(f"events share no history with entity {entity_id}")


def extends_head(head: Collection[EventId], staged: Sequence[AdmittedEvent]) -> bool:
    """Whether ``staged`` (parents first) only extends ``head``: every parent a tip of it
    or another staged event, none a genesis, and none a tip already.

    Then each staged event descends from the head, and from no other tip (the head is an
    antichain), and is in no one's history yet: the head just advances past them, as the
    walk would conclude. A live edit pushed to a subscriber nearly always has this shape.
    """
    ids = {e.id for e in staged}
    for event in staged:
        parents = event.parent
        if not parents or event.id in head:
            return False
        for parent in parents:
            if parent not in ids and parent not in head:
                return False
    return True


def above_head(head: Collection[EventId], top: int, staged: Sequence[AdmittedEvent]) -> bool:
    """Whether every staged event is of a generation no tip of ``head`` exceeds (``top``,
    the head's largest) and none is a tip itself. Valid only where this node alone writes
    its store.

    Then no tip descends from a staged event (a descendant's generation is larger), so
    none is in the head's history. A tip one descends from can only be one it names, or
    one a staged event it descends from names: through a parent in the history, that tip
    would lie below another tip. That needs every event this node holds to be in the
    resident's history, which holds where no other process writes the store. Concurrent
    writers' events reach a subscriber one at a time in this shape.
    """
    return all(e.generation >= top and e.id not in head for e in staged)


def above_boundary(head: Collection[EventId], floor: int, staged: Sequence[AdmittedEvent]) -> bool:
    """Whether every staged event is of a generation above ``floor`` (the highest of the
    snapshot tips a cache ever merged into the entity, ``Entity.boundary_top``; 0 for
    none) and none is a tip itself. Valid only on a cache that alone writes its store.

    Then no staged event is in the head's history. On such a cache that history is the
    events it holds and those below the snapshots it merged: a staged event is neither
    (admission skips what is held, and an event below a snapshot's tip has a smaller
    generation). Admission names each parent of a staged event in that history (held, a
    tip, or a snapshot's tip) or staged before it, so, as for :func:`above_head`, a tip
    one descends from can only be one it names. Concurrent writers' events reach a
    subscriber in this shape long after its head moved past their generation (W3: the
    walks that placed them were a third of a client's time).
    """
    return all(e.generation > floor and e.id not in head for e in staged)
