"""Deterministic building blocks for the storage conformance suite (ARCHITECTURE.md §6).

Events, one entity's small DAG (:class:`History`) and stored states, all deterministic: the
same arguments give byte-identical events, so engines driven with them can be compared
(:func:`engine_content` puts everything an engine holds in a comparable form).
Re-exported by :mod:`mycelia.storage.testing`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mycelia.proto import AdmittedEvent, Clock, EntityId, EntityState, Event, EventId, State
from mycelia.retrieval import StoredState
from mycelia.storage.engine import MetaRecord, StorageEngine

__all__ = ["History", "engine_content", "event_key", "genesis", "state_key", "state_of", "update"]


def genesis(collection: str = "items", n: int = 0) -> AdmittedEvent:
    """A deterministic genesis (``n`` picks the nonce, so the entity)."""
    event = Event.genesis(
        collection=collection,
        system=None,
        operations={"lww": [b"genesis %d" % n]},
        nonce=n.to_bytes(16, "big"),
    )
    return AdmittedEvent(event, 1)


def update(parents: Sequence[AdmittedEvent], tag: bytes) -> AdmittedEvent:
    """An update on ``parents`` (one entity), with its generation."""
    first = parents[0]
    event = Event.update(
        entity_id=first.entity_id,
        collection=first.collection,
        parent=Clock(p.id for p in parents),
        operations={"lww": [tag]},
    )
    return AdmittedEvent(event, 1 + max(p.generation for p in parents))


def state_of(head: Sequence[AdmittedEvent], values: dict[str, object] | None = None) -> StoredState:
    """A stored state whose head is ``head`` (events of one entity)."""
    first = head[0]
    state = State.of(
        head={e.id: e.generation for e in head},
        buffers={"lww": b"".join(sorted(e.id for e in head))},
    )
    return StoredState(EntityState(first.entity_id, first.collection, state), values or {})


@dataclass(frozen=True)
class History:
    """One entity's small DAG: g; a, b on g; c on a; m on (c, b); plus a sibling s on g."""

    g: AdmittedEvent
    a: AdmittedEvent
    b: AdmittedEvent
    c: AdmittedEvent
    m: AdmittedEvent
    s: AdmittedEvent

    @classmethod
    def make(cls, collection: str = "items", n: int = 0) -> History:
        """The DAG for entity number ``n`` of ``collection``."""
        g = genesis(collection, n)
        a, b, s = update([g], b"a"), update([g], b"b"), update([g], b"s")
        c = update([a], b"c")
        return cls(g, a, b, c, update([c, b], b"m"), s)

    @property
    def events(self) -> list[AdmittedEvent]:
        """Every event, parents first (generation, then id)."""
        every = [self.g, self.a, self.b, self.c, self.m, self.s]
        return sorted(every, key=lambda e: (e.generation, e.id))

    @property
    def entity_id(self) -> EntityId:
        """The entity's id."""
        return self.g.entity_id


def event_key(event: AdmittedEvent) -> tuple[EventId, int, bytes]:
    """An event in a comparable form (id, generation, canonical bytes)."""
    return event.id, event.generation, event.to_bytes()


def state_key(stored: StoredState | None) -> tuple[bytes, dict[str, object]] | None:
    """A stored state in a comparable form (state bytes, values)."""
    return None if stored is None else (stored.state.to_bytes(), dict(stored.values))


async def engine_content(engine: StorageEngine) -> list[object]:
    """Everything an engine holds, in a comparable form (dump, feed, last offset)."""
    content: list[object] = []
    async for record in engine.dump():
        if isinstance(record, MetaRecord):
            content.append(("meta", record.key, record.value))
        else:
            events = [event_key(e) for e in record.events]
            content.append(("entity", record.entity_id, events, state_key(record.state)))
    feed = await engine.read_since(0, limit=1 << 30)
    content.append(("feed", [(f.offset, f.entity_id, f.collection, f.head) for f in feed]))
    content.append(("last", await engine.last_offset()))
    return content
