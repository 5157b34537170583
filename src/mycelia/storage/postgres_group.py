"""Group commit for the PostgreSQL engine: concurrent writes share one ``write_batch``
statement — one transaction, one fsync (ARCHITECTURE.md §6; LMDB's writer does the same).

A server commits each client's transaction as it arrives, and with many clients many
writes are in flight at once. Each was its own statement and its own commit, and
PostgreSQL spent most of its CPU on them queueing for the feed clock and flushing
its log one commit at a time. Now a write that ``write_batch`` can take
(:func:`mycelia.storage.postgres_write.write_batch_params`) joins the group being
gathered, and one statement writes the group.

Invariants:

- **One statement in flight.** :class:`GroupCommit` runs one group at a time, on a task
  of its own; a group is every write queued while the one before ran (up to
  :data:`MAX_GROUP` states), so an idle engine writes at once and a busy one in groups.
- **Members are disjoint.** A group holds no two writes of one entity, or of one event
  (each is a compare-and-set on its own bases); a write that overlaps waits for the next.
- **Each member's outcome is its own.** The group's rows are its members' in order, so
  each member's feed offsets are a run, increasing in its batch's order, as a write's
  must be. If the group's statement writes nothing — a stored head moved under one of
  them, or PostgreSQL aborted it — each member is written alone, in turn, and gets that
  statement's result, or its error, as if there had been no group.
- A member's caller that is cancelled does not unqueue it: its write may still commit,
  as a cancelled statement's may.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from mycelia.proto import Clock, EntityId, EventId
from mycelia.retrieval import WriteBatch
from mycelia.storage.postgres_sql import StateRow

__all__ = ["MAX_GROUP", "GroupCommit", "Written"]

log = logging.getLogger(__name__)

MAX_GROUP: Final = 256
"""Most states one group's statement writes."""

Written = tuple[frozenset[EventId], tuple[int, ...]]
"""What a member's write did: its new events, and the offsets of its rows."""
Run = Callable[[list[Any]], Awaitable[tuple[frozenset[EventId], int] | None]]
"""Runs ``write_batch`` with its parameters: the new events and the last offset taken, or
``None`` when a stored head moved (nothing was written)."""
Params = Callable[[WriteBatch, Sequence[StateRow]], list[Any] | None]
"""``write_batch``'s parameters for a batch and its rows (``None``: it cannot take it)."""


@dataclass(slots=True)
class _Member:
    batch: WriteBatch
    rows: list[StateRow]
    params: list[Any]
    done: asyncio.Future[Written | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class GroupCommit:
    """Concurrent ``write_batch`` writes, one statement per group (see the module)."""

    def __init__(self, run: Run, params: Params) -> None:
        self._run = run
        self._params = params
        self._queue: list[_Member] = []
        self._task: asyncio.Task[None] | None = None

    async def write(
        self, batch: WriteBatch, rows: list[StateRow], params: list[Any]
    ) -> Written | None:
        """Write ``batch`` (its encoded ``rows``, its own ``write_batch`` ``params``) with
        whatever else is queued; ``None`` when a stored head moved under it (nothing of it
        was written). Raises what its own statement raised."""
        member = _Member(batch, rows, params)
        self._queue.append(member)
        if self._task is None:
            self._task = asyncio.create_task(self._drain(), name="postgres group commit")
        return await asyncio.shield(member.done)

    async def close(self) -> None:
        """Finish the groups queued."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def _drain(self) -> None:
        group: list[_Member] = []
        try:
            while self._queue:
                group = self._take()
                await self._commit(group)
        finally:
            self._task = None
            for member in group + self._queue:  # left unsettled only if this was cancelled
                member.done.cancel()
            self._queue.clear()

    def _take(self) -> list[_Member]:
        group: list[_Member] = []
        entities: set[bytes] = set()
        events: set[EventId] = set()
        states = 0
        rest: list[_Member] = []
        for member in self._queue:
            mine = {r[0] for r in member.rows}
            ids = {e.id for e in member.batch.events}
            fits = not group or states + len(member.rows) <= MAX_GROUP
            if fits and not (mine & entities or ids & events):
                group.append(member)
                entities |= mine
                events |= ids
                states += len(member.rows)
            else:
                rest.append(member)
        self._queue = rest
        return group

    async def _commit(self, group: list[_Member]) -> None:
        if len(group) > 1:
            merged = self._merged(group)
            try:
                written = await self._run(merged) if merged is not None else None
            except Exception as exc:  # noqa: BLE001 - each member is written alone instead
                log.info("a group of %d writes failed (%s); writing each alone", len(group), exc)
            else:
                if written is not None:
                    _share(group, *written)
                    return
        for member in group:
            try:
                alone = await self._run(member.params)
            except Exception as exc:  # noqa: BLE001 - the member's own error, for its caller
                _settle(member, exc)
            else:
                _settle(member, None if alone is None else _outcome(member, *alone))

    def _merged(self, group: list[_Member]) -> list[Any] | None:
        bases: dict[EntityId, Clock] = {}
        for member in group:
            bases.update(member.batch.bases)
        batch = WriteBatch(
            events=tuple(e for m in group for e in m.batch.events),
            states=tuple(s for m in group for s in m.batch.states),
            bases=bases,
        )
        return self._params(batch, [r for m in group for r in m.rows])


def _share(group: list[_Member], new: frozenset[EventId], last: int) -> None:
    """Give each member its part of the group's result (its rows' offsets are a run)."""
    end = last
    for member in reversed(group):
        _settle(member, _outcome(member, new, end))
        end -= len(member.rows)


def _outcome(member: _Member, new: frozenset[EventId], last: int) -> Written:
    count = len(member.rows)
    mine = frozenset(e.id for e in member.batch.events) & new
    return mine, tuple(range(last - count + 1, last + 1))


def _settle(member: _Member, outcome: Written | BaseException | None) -> None:
    if member.done.done():
        return
    if isinstance(outcome, BaseException):
        member.done.set_exception(outcome)
    else:
        member.done.set_result(outcome)
