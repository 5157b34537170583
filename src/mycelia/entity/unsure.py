"""Heads a local commit may have left holding an ancestor of another tip, and their tidying
(ARCHITECTURE.md §7, local-first commits).

A transaction's events are placed without a walk, but fresh content is not always a new
event: an update's id binds only its entity, parents and edits, so the same edit made on
the same head by another node is the same event, and a snapshot merged since the fork may
descend from it. On an ephemeral node that holds no history below such a snapshot, the
commit cannot tell, so it marks the head *unsure* and :meth:`UnsureHeads.tidy` asks the
durable peer later.

Invariants:

- A mark is the meta record :func:`unsure_record` written in the commit's own storage
  write (it outlives a restart: :meth:`UnsureHeads.keep` takes it up), and deleted in the
  write that tidies the head, unless a commit marked the head again meanwhile.
- The history is fetched before the entity's lock is taken: a commit never waits for the
  durable peer. Ancestry does not change, so the tips it shows stale are dropped from
  whatever the head is by then; an entity reset meanwhile is looked at again next time.
- A head whose history cannot be fetched (or written) now stays unsure.
- A head whose history is too long to walk within the budget stays unsure too, and is not
  walked again until the next start (a walk that long would be repeated on every commit
  confirmed); it is logged as a warning. Its values are right either way: an extra tip
  only widens the parents of the events made on it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Final

from mycelia.entity.entity import Entity
from mycelia.entity.placement import Placement
from mycelia.entity.residents import Residents
from mycelia.entity.runs import IngestResult, Meta, Plan, Staging, fetched
from mycelia.entity.snapshots import drop_known_ancestors
from mycelia.entity.verdicts import above_head
from mycelia.errors import BudgetExceeded, MyceliaError
from mycelia.proto import AdmittedEvent, EntityId, EventId
from mycelia.retrieval import StagingMap

__all__ = ["UNSURE_PREFIX", "UnsureHeads", "unsure_record"]

log = logging.getLogger(__name__)

UNSURE_PREFIX: Final = "unsure/"
"""The meta records of the unsure heads: ``unsure/`` and the entity's base64 id; the value
is empty."""


def unsure_record(entity_id: EntityId, *, settled: bool = False) -> tuple[str, bytes | None]:
    """The meta record marking ``entity_id``'s head unsure (``settled``: deleting it)."""
    return f"{UNSURE_PREFIX}{entity_id.to_base64()}", None if settled else b""


class UnsureHeads:
    """An applier's unsure heads (see the module docstring); true while there is one."""

    def __init__(
        self,
        *,
        staging: Callable[[Iterable[EntityId], IngestResult], Staging],
        load: Callable[[EntityId], Awaitable[Entity | None]],
        placement: Placement,
        residents: Residents,
        epochs: Mapping[EntityId, int],
        budget: int,
    ) -> None:
        self._staging = staging
        self._load = load
        self._placement = placement
        self._residents = residents
        self._epochs = epochs
        """The applier's resets per entity (read live)."""
        self._budget = budget
        self._marks: dict[EntityId, int] = {}
        """Each unsure head's entity → how many commits marked it."""
        self._undecided: set[EntityId] = set()
        """Marked heads whose walk ran out of budget: not walked again in this run."""

    def __bool__(self) -> bool:
        return bool(self._marks)

    def keep(self, entity_ids: Iterable[EntityId]) -> None:
        """Take up the marks an earlier run wrote (their meta records), at open."""
        self._marks.update(dict.fromkeys(entity_ids, 1))

    def note(
        self, entity: Entity, fork: Mapping[EventId, int], staged: Sequence[AdmittedEvent]
    ) -> None:
        """Mark ``entity``'s head if ``staged``, fresh events made on the head ``fork``,
        may be in its history: the head moved since the fork, past their generation (a
        tip could descend from them). Call before they are applied."""
        if entity.head_map != fork and not above_head(
            entity.head_map, entity.top_generation, staged
        ):
            self._marks[entity.entity_id] = self._marks.get(entity.entity_id, 0) + 1

    def records(self, entity_ids: Iterable[EntityId]) -> Meta:
        """The marks of ``entity_ids``, to write with their commit."""
        marks = self._marks
        return tuple(unsure_record(i) for i in entity_ids if i in marks) if marks else ()

    async def tidy(self) -> None:
        """Drop from each unsure head the tips the durable peer's history shows are
        ancestors of another, and its mark unless a commit marked it again meanwhile.
        Never raises for one entity's trouble: that entity stays unsure, for next time."""
        for entity_id, marks in sorted(self._marks.items()):
            if entity_id in self._undecided:
                continue
            epoch = self._epochs.get(entity_id, 0)
            try:
                stale, events = await self._stale_tips(entity_id)
                async with self._staging((entity_id,), IngestResult()) as run:
                    if self._epochs.get(entity_id, 0) != epoch:
                        continue  # reset meanwhile: the next call looks again
                    run.add(await self._without(entity_id, stale, events))
                    if self._marks.get(entity_id) == marks:
                        del self._marks[entity_id]
                        run.meta = (unsure_record(entity_id, settled=True),)
            except BudgetExceeded as exc:
                self._undecided.add(entity_id)
                log.warning("the head of %s stays unsure until the next start: %s", entity_id, exc)
            except MyceliaError as exc:  # the history, or the write: the next call retries
                self._marks.setdefault(entity_id, marks)
                log.info("the head of %s stays unsure for now: %s", entity_id, exc)

    async def _stale_tips(self, entity_id: EntityId) -> tuple[set[EventId], list[AdmittedEvent]]:
        """The tips of the entity's head that are ancestors of another, and the events
        fetched to know it."""
        entity = await self._load(entity_id)
        if entity is None or not entity.exists or len(entity.head) < 2:
            return set(), []
        tips = dict(entity.head_generations)
        getter = self._placement.getter(entity_id, StagingMap())
        kept = await drop_known_ancestors(
            tips, getter, root=EventId(entity_id), budget=self._budget, complete=True
        )
        return set(tips).difference(kept), fetched(getter)

    async def _without(
        self, entity_id: EntityId, stale: set[EventId], events: list[AdmittedEvent]
    ) -> Plan | None:
        entity = await self._load(entity_id)
        if entity is None or not stale.intersection(entity.head_map):
            return None
        head = {i: g for i, g in entity.head_generations.items() if i not in stale}
        if not head:
            return None
        before = entity.snapshot()
        entity.set_head(head)
        self._residents.put(entity)
        return Plan(entity, before, events, [], set(), snapshot=True)
