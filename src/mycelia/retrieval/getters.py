"""Getters: staging first, then storage, then (on ephemeral nodes) a remote peer.

:class:`LocalGetter` is what a durable node compares with: staging, then its storage,
which is definitive. :class:`CachedGetter` adds a remote source for ids neither has; what
it fetches is verified (the event must hash to the id asked for and belong to the entity
being compared) and remembered so the next comparison does not ask again.

:func:`local_first` runs a walk on what is held here before it asks the peer. An
ephemeral node holds a snapshot's state, not the events under its head, so most walks
meet that boundary; an event the walk reaches from *both* clocks is a common ancestor
whatever it holds, and the verdict does not need it (:mod:`mycelia.event_dag.comparison`,
missing events). Only a walk that fails for want of an event asks the peer, and is run
again, so a walk that meets the boundary from both sides costs the peer nothing. (Under
the W3 load, 100 clients editing one text each asked their server for history on most
concurrent edits, and the answers, queued behind each other, came too late.)

A walk's read-ahead (:mod:`mycelia.retrieval.protocols`) is passed whole only to a source
where a read costs a round trip (:func:`reads_ahead`) and to the remote peer. A store in
this process (memory, a memory-mapped LMDB file) is asked for an eighth of it
(:data:`LOCAL_READ_AHEAD_SHIFT`): there a read-ahead saves only the cost of a step, and
every ancestor it reads past the point where the walk ends is decoded for nothing. (A
client on MemoryStorage, one of 40 editing three shared texts, spent a quarter of its time
decoding read-ahead it never used: 319,000 decodes in all against 145,000 with none and
169,000-187,000 with an eighth, while a walk down two branches of 10 to 5,000 events each
takes 0.88-1.17x the time it took with the whole read-ahead.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Final, TypeVar

from mycelia.errors import EventNotFound
from mycelia.proto import AdmittedEvent, EntityId, EventId
from mycelia.retrieval.protocols import EventSource
from mycelia.retrieval.staging import StagingMap

__all__ = ["CachedGetter", "LocalGetter", "RemoteEvents", "local_first", "reads_ahead"]

R = TypeVar("R")

LOCAL_READ_AHEAD_SHIFT: Final = 3
"""A store that reads in this process is asked for an eighth of a walk's read-ahead (see
the module docstring)."""

RemoteEvents = Callable[[Sequence[EventId], int], Awaitable[Sequence[AdmittedEvent]]]
"""Asks a durable peer for events by id, plus up to ``ahead`` ancestors (the node layer
supplies it; it answers with nothing when no peer is reachable)."""


def reads_ahead(source: object) -> bool:
    """Whether a walk should pass its whole read-ahead to ``source``: unless the source
    says its reads are local (``local_reads = True``: no round trip per call), as the
    in-process engines do (see the module docstring)."""
    return getattr(source, "local_reads", False) is not True


class LocalGetter:
    """Staging, then storage: an :class:`~mycelia.retrieval.EventSource` for the comparison."""

    __slots__ = ("_shift", "_staging", "_storage")

    def __init__(self, staging: StagingMap, storage: EventSource) -> None:
        self._staging = staging
        self._storage = storage
        self._shift = 0 if reads_ahead(storage) else LOCAL_READ_AHEAD_SHIFT
        """How far the walk's read-ahead is shifted down before storage is asked."""

    async def get_events(
        self, ids: Collection[EventId], *, ahead: int = 0
    ) -> Mapping[EventId, AdmittedEvent]:
        """Staged events first; the rest from storage (which may read ahead, where a read
        costs a round trip)."""
        found = self._staging.lookup(ids)
        ahead >>= self._shift
        if len(found) < len(ids) or ahead:
            rest = [i for i in ids if i not in found]
            more = await self._storage.get_events(rest, ahead=ahead)
            for eid, event in more.items():
                found.setdefault(eid, event)
        return found


class CachedGetter(LocalGetter):
    """Staging, storage, then a remote peer; remote answers are checked and remembered.

    What the peer sends is kept only if it is an event of the entity being compared (a
    peer cannot inject another entity's events) and, when its parents are known here, its
    generation agrees with them. Fetched events are returned by :meth:`fetched` so the
    applier stores them with its result.
    """

    __slots__ = ("_entity", "_fetched", "_remote")

    def __init__(
        self,
        staging: StagingMap,
        storage: EventSource,
        remote: RemoteEvents,
        *,
        entity_id: EntityId,
    ) -> None:
        super().__init__(staging, storage)
        self._remote = remote
        self._entity = entity_id
        self._fetched: dict[EventId, AdmittedEvent] = {}

    async def get_events(
        self, ids: Collection[EventId], *, ahead: int = 0
    ) -> Mapping[EventId, AdmittedEvent]:
        """Local first; ids still missing are asked of the remote peer in one request."""
        found = dict(await super().get_events(ids, ahead=ahead))
        for eid in ids:
            if eid not in found and eid in self._fetched:
                found[eid] = self._fetched[eid]
        ask = [i for i in ids if i not in found]
        if ask:
            for event in await self._remote(ask, ahead):
                if event.entity_id != self._entity or not self._consistent(event, found):
                    continue
                self._fetched.setdefault(event.id, event)
                found.setdefault(event.id, event)
        return found

    def _consistent(self, event: AdmittedEvent, around: Mapping[EventId, AdmittedEvent]) -> bool:
        parents = [around.get(p) or self._fetched.get(p) for p in event.parent]
        if not parents:
            return event.generation == 1
        if any(p is None for p in parents):
            return True  # parents unknown here: the generation orders the walk only
        return event.generation == 1 + max(p.generation for p in parents if p is not None)

    def fetched(self) -> list[AdmittedEvent]:
        """Events fetched from the remote during this run (to be stored with the result)."""
        return list(self._fetched.values())

    def held(self) -> LocalGetter:
        """What is held here (staging and storage), without asking the remote."""
        return LocalGetter(self._staging, self._storage)


async def local_first(getter: LocalGetter, walk: Callable[[LocalGetter], Awaitable[R]]) -> R:
    """``walk(getter)``, tried on local history first when ``getter`` can ask a peer (see
    the module docstring); raises what the walk raises with the peer asked too."""
    if isinstance(getter, CachedGetter):
        try:
            return await walk(getter.held())
        except EventNotFound:
            pass  # the verdict needs an event only the peer holds: ask it
    return await walk(getter)
