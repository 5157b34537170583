"""A live query's change sets, and the queue that holds them for its reader.

A :class:`ChangeSet` is one step of a live query's result: the first carries ``initial``,
later ones ``added``, ``updated`` and ``removed`` views.

:class:`ChangeQueue` invariants:

- **What the reader takes adds up to the result.** Applying every set taken, in order, to
  an empty result gives the query's current result.
- **Bounded by the result, not by the commits.** A set the reader has not taken yet
  absorbs the next one, entity by entity: the latest view wins, added-then-removed is
  nothing, removed-then-added is an update. So a reader that lags, or never iterates (an
  app that only reads ``live.items``), holds at most one view per entity in play, never
  one set per commit. Each absorption costs O(the new set), never O(the result).
- A reader that keeps up sees every set as it was emitted (nothing is absorbed into a set
  already taken). The first set (``initial``, :meth:`ChangeQueue.start`) is never
  merged; the end marker (``None``) comes after everything queued before it.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from mycelia.entity.model import Model
from mycelia.proto import EntityId

__all__ = ["ChangeQueue", "ChangeSet"]

M = TypeVar("M", bound=Model)


@dataclass(frozen=True, slots=True)
class ChangeSet(Generic[M]):
    """One step of a live query's result."""

    initial: list[M] = field(default_factory=list)
    added: list[M] = field(default_factory=list)
    updated: list[M] = field(default_factory=list)
    removed: list[M] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.initial or self.added or self.updated or self.removed)


class _Kind(enum.Enum):
    ADDED = "added"
    UPDATED = "updated"
    REMOVED = "removed"


_FOLD: dict[tuple[_Kind | None, _Kind], _Kind | None] = {
    # (what the waiting set says of the entity, what the new set says) -> what it says now
    (None, _Kind.ADDED): _Kind.ADDED,
    (None, _Kind.UPDATED): _Kind.UPDATED,
    (None, _Kind.REMOVED): _Kind.REMOVED,
    (_Kind.ADDED, _Kind.ADDED): _Kind.ADDED,
    (_Kind.ADDED, _Kind.UPDATED): _Kind.ADDED,
    (_Kind.ADDED, _Kind.REMOVED): None,  # never shown: nothing to say
    (_Kind.UPDATED, _Kind.ADDED): _Kind.UPDATED,
    (_Kind.UPDATED, _Kind.UPDATED): _Kind.UPDATED,
    (_Kind.UPDATED, _Kind.REMOVED): _Kind.REMOVED,
    (_Kind.REMOVED, _Kind.ADDED): _Kind.UPDATED,  # shown before, shown again
    (_Kind.REMOVED, _Kind.UPDATED): _Kind.UPDATED,
    (_Kind.REMOVED, _Kind.REMOVED): _Kind.REMOVED,
}
"""How a waiting set absorbs the next one, entity by entity (the newer view is kept)."""


class ChangeQueue(Generic[M]):
    """The change sets a live query's reader has yet to take (see the module docstring)."""

    def __init__(self) -> None:
        self._ready: deque[ChangeSet[M] | None] = deque()
        self._waiting: dict[EntityId, tuple[_Kind, M]] | None = None
        """The newest set, not taken yet, as entity → (kind, view): it absorbs the next."""
        self._emitted: ChangeSet[M] | None = None
        """The newest set as it was emitted, while nothing absorbed into it: a reader that
        keeps up takes it as it is (a live query names each entity once in a set, so
        absorbing it into nothing would give it back)."""
        self._wake = asyncio.Event()

    def start(self, initial: list[M]) -> None:
        """Queue the first set: the whole result (never absorbed, even when empty)."""
        self._seal()
        self._ready.append(ChangeSet(initial=initial))
        self._wake.set()

    def put(self, changes: ChangeSet[M]) -> None:
        """Queue a later set (``added``/``updated``/``removed``; it may be absorbed)."""
        if not changes:
            return
        if self._waiting is None and self._emitted is None:
            self._emitted = changes  # (nothing to absorb it into: the reader keeps up)
            self._wake.set()
            return
        emitted, self._emitted = self._emitted, None
        if emitted is not None:
            self._waiting = _absorbed({}, emitted)
        self._waiting = _absorbed(self._waiting or {}, changes)
        self._wake.set()

    def end(self) -> None:
        """Queue the end marker after everything queued so far."""
        self._seal()
        self._ready.append(None)
        self._wake.set()

    async def get(self) -> ChangeSet[M] | None:
        """The oldest set not taken (waits for one); ``None`` once ended."""
        while not self._ready and not self._waiting and self._emitted is None:
            self._wake.clear()
            await self._wake.wait()
        return self._take()

    def take_all(self) -> list[ChangeSet[M]]:
        """Every set queued now, without waiting (the end marker stays queued)."""
        out = []
        while self._ready or self._waiting or self._emitted is not None:
            item = self._take()
            if item is None:
                self._ready.appendleft(None)
                break
            out.append(item)
        return out

    def _take(self) -> ChangeSet[M] | None:
        if not self._ready:
            self._seal()
        return self._ready.popleft()

    def _seal(self) -> None:
        """Move the absorbing set into the ready line (nothing joins it afterwards)."""
        emitted, self._emitted = self._emitted, None
        if emitted is not None:
            self._ready.append(emitted)
            return
        waiting, self._waiting = self._waiting, None
        if not waiting:
            return
        out: ChangeSet[M] = ChangeSet()
        lists = {_Kind.ADDED: out.added, _Kind.UPDATED: out.updated, _Kind.REMOVED: out.removed}
        for kind, view in waiting.values():
            lists[kind].append(view)
        self._ready.append(out)


def _absorbed(
    waiting: dict[EntityId, tuple[_Kind, M]], changes: ChangeSet[M]
) -> dict[EntityId, tuple[_Kind, M]]:
    """``waiting`` once it absorbed ``changes``, entity by entity (see :data:`_FOLD`)."""
    for kind, views in (
        (_Kind.ADDED, changes.added),
        (_Kind.UPDATED, changes.updated),
        (_Kind.REMOVED, changes.removed),
    ):
        for view in views:
            before = waiting.pop(view.id, (None, view))[0]
            after = _FOLD[before, kind]
            if after is not None:
                waiting[view.id] = (after, view)
    return waiting
