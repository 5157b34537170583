"""The outbox: commits an ephemeral node owes its durable peer (ARCHITECTURE.md §7).

A local commit on an ephemeral node is durable here at once and *owed* until the durable
peer confirms it. Each owed commit is one meta record, ``outbox/<seq>`` (``seq`` a
zero-padded counter, so key order is commit order), holding its events sealed as
canonical bytes with their generations, written in the **same storage write** as the
commit itself: a crash or restart cannot separate the two. Confirmed and reverted
commits are settled by deleting their records, in batches; settling late is harmless
(a commit pushed twice is deduplicated by event id).

Invariants:

- sequence numbers are assigned in the order commits reach :meth:`Outbox.record`, which
  the committer calls under the entities' locks, so a commit built on another always has
  the larger number;
- :meth:`Outbox.load` reads the records back in key (= commit) order;
- a record's bytes decode back to exactly the events that were committed (every event is
  re-verified by :meth:`~mycelia.proto.Event.from_bytes`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from mycelia.entity.unsure import UNSURE_PREFIX
from mycelia.errors import DecodeError, StorageCorrupt
from mycelia.proto import AdmittedEvent, EntityId, Event, EventId
from mycelia.proto.codec import expect_bytes, expect_int, expect_list, pack, unpack
from mycelia.retrieval import WriteBatch
from mycelia.storage import StorageEngine
from mycelia.storage.meta import OUTBOX, OUTBOX_PREFIX

__all__ = ["LEGACY_OUTBOX", "OUTBOX_PREFIX", "Outbox", "Owed"]

LEGACY_OUTBOX: Final = OUTBOX
"""The single record older versions kept every owed event in (migrated on load)."""
_DIGITS: Final = 20


@dataclass(frozen=True, slots=True)
class Owed:
    """One owed commit: its sequence number and its events (parents first)."""

    seq: int
    events: tuple[AdmittedEvent, ...]

    @property
    def key(self) -> str:
        """Its meta record's key."""
        return f"{OUTBOX_PREFIX}{self.seq:0{_DIGITS}d}"

    @property
    def entities(self) -> frozenset[EntityId]:
        """The entities it changes."""
        return frozenset(e.entity_id for e in self.events)

    @property
    def ids(self) -> tuple[EventId, ...]:
        """Its events' ids."""
        return tuple(e.id for e in self.events)

    @property
    def wire_bytes(self) -> int:
        """The bytes of its events on the wire."""
        return sum(len(e.event.to_bytes()) for e in self.events)

    def record(self) -> tuple[str, bytes]:
        """Its meta record."""
        return self.key, pack([[e.generation, e.event.to_bytes()] for e in self.events])


class Outbox:
    """Sequence numbers and records of owed commits (see the module docstring)."""

    def __init__(self, storage: StorageEngine) -> None:
        self._storage = storage
        self._next = 1

    async def unsure(self) -> list[EntityId]:
        """The entities whose head a local commit left unsure (:mod:`mycelia.entity.unsure`)."""
        unsure = []
        for key, _ in await self._storage.scan_meta(UNSURE_PREFIX):
            try:
                unsure.append(EntityId.from_base64(key[len(UNSURE_PREFIX) :]))
            except DecodeError as exc:
                raise StorageCorrupt(f"the meta record {key!r} names no entity: {exc}") from exc
        return unsure

    async def load(self) -> list[Owed]:
        """Every owed commit in storage, oldest first (call once, before any record).

        A store written by an older version keeps its owed events in one record; they
        become one owed commit here (their generations are read from the stored events).
        """
        owed = [_decode(key, raw) for key, raw in await self._storage.scan_meta(OUTBOX_PREFIX)]
        if owed:
            self._next = owed[-1].seq + 1
        legacy = await self._storage.get_meta(LEGACY_OUTBOX)
        if legacy is not None:
            owed.append(await self._migrate(legacy))
        return owed

    async def _migrate(self, raw: bytes) -> Owed:
        try:
            items = expect_list(unpack(raw, what="outbox"), "outbox")
            events = [Event.from_bytes(expect_bytes(b, "owed event")) for b in items]
        except DecodeError as exc:
            raise StorageCorrupt(f"the outbox record does not decode: {exc}") from exc
        stored = await self._storage.get_events([e.id for e in events])
        owed = self.record(stored[e.id] for e in events if e.id in stored)
        await self._storage.write(WriteBatch(meta=((LEGACY_OUTBOX, None), owed.record())))
        return owed

    def record(self, events: Iterable[AdmittedEvent]) -> Owed:
        """The next owed commit of ``events`` (write its :meth:`Owed.record` with them)."""
        owed = Owed(self._next, tuple(events))
        self._next += 1
        return owed

    @staticmethod
    def settled(owed: Iterable[Owed]) -> tuple[tuple[str, bytes | None], ...]:
        """The meta records that settle ``owed`` (confirmed or reverted)."""
        return tuple((o.key, None) for o in owed)


def _decode(key: str, raw: bytes) -> Owed:
    try:
        seq = int(key[len(OUTBOX_PREFIX) :])
        items = expect_list(unpack(raw, what="outbox record"), "outbox record")
        events = []
        for item in items:
            generation, body = expect_list(item, "owed event", length=2)
            event = Event.from_bytes(expect_bytes(body, "owed event"))
            events.append(AdmittedEvent(event, expect_int(generation, "owed generation")))
    except (DecodeError, ValueError) as exc:
        raise StorageCorrupt(f"the outbox record {key!r} does not decode: {exc}") from exc
    return Owed(seq, tuple(events))
