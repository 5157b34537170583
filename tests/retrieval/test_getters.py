"""A walk passes its whole read-ahead only where a read costs a round trip."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from mycelia.entity.runs import Overlay
from mycelia.event_dag import DivergedSince, compare
from mycelia.proto import AdmittedEvent, Clock, EventId
from mycelia.retrieval import LocalGetter, StagingMap, WriteBatch, reads_ahead
from mycelia.retrieval.getters import LOCAL_READ_AHEAD_SHIFT
from mycelia.storage import MemoryStorage
from mycelia.storage.testing import genesis, update


class Recording(MemoryStorage):
    """A MemoryStorage that notes the read-ahead of every read."""

    def __init__(self) -> None:
        super().__init__()
        self.aheads: list[int] = []

    async def get_events(
        self, ids: Collection[EventId], *, ahead: int = 0
    ) -> Mapping[EventId, AdmittedEvent]:
        self.aheads.append(ahead)
        return await super().get_events(ids, ahead=ahead)


class Remote:
    """A source that does not say its reads are local (as a database server's)."""

    def __init__(self, store: Recording) -> None:
        self.store = store

    async def get_events(
        self, ids: Collection[EventId], *, ahead: int = 0
    ) -> Mapping[EventId, AdmittedEvent]:
        return await self.store.get_events(ids, ahead=ahead)


async def two_branches(length: int) -> tuple[Recording, AdmittedEvent, AdmittedEvent]:
    """A store holding two branches of ``length`` events from one genesis; their tips."""
    root = genesis()
    left, right = [root], [root]
    for i in range(length):
        left.append(update([left[-1]], b"l%d" % i))
        right.append(update([right[-1]], b"r%d" % i))
    store = Recording()
    await store.write(WriteBatch((*left, *right[1:])))
    return store, left[-1], right[-1]


async def walk(source_of: type[Recording] | type[Remote]) -> list[int]:
    """The read-ahead asked of storage at each step of one walk down two long branches."""
    store, left, right = await two_branches(200)
    source = store if source_of is Recording else Remote(store)
    outcome = await compare(LocalGetter(StagingMap(), source), Clock([left.id]), Clock([right.id]))
    assert isinstance(outcome.relation, DivergedSince)
    assert outcome.relation.meet == Clock([genesis().id])
    return store.aheads


async def test_an_in_process_store_is_asked_for_an_eighth_of_a_walk_s_read_ahead() -> None:
    remote, local = await walk(Remote), await walk(Recording)
    first = next(i for i, ahead in enumerate(remote) if ahead)  # the steps before read none
    assert local[:first] == remote[:first]
    assert local[first] == remote[first] >> LOCAL_READ_AHEAD_SHIFT > 0


async def test_the_engines_and_an_overlay_on_them_say_their_reads_are_local() -> None:
    store = Recording()
    assert not reads_ahead(store)
    assert not reads_ahead(Overlay({}, store))
    assert reads_ahead(Remote(store))
    assert reads_ahead(Overlay({}, Remote(store)))
