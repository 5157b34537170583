"""The outbox: commits an ephemeral node owes a durable peer (ARCHITECTURE.md §7).

A commit made while no durable peer is reachable is durable locally and *owed*: its
events are sealed (canonical bytes) into the ``outbox`` meta record in the **same storage
write** as the commit, so a crash or restart cannot separate the two. On (re)connect the
connection pushes them until the server confirms, then settles them. Retrying is harmless
because events are deduplicated by id.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Final

from mycelia.proto import Event, EventId
from mycelia.proto.codec import expect_bytes, expect_list, pack, unpack
from mycelia.retrieval import WriteBatch
from mycelia.storage import StorageEngine

__all__ = ["OUTBOX_META", "Outbox"]

OUTBOX_META: Final = "outbox"


class Outbox:
    """Owed events, persisted in one meta record; change it only through :meth:`owe`."""

    def __init__(self, storage: StorageEngine) -> None:
        self._storage = storage
        self._events: list[Event] | None = None
        self.lock = asyncio.Lock()
        """Held across read-modify-write of the record (commits and settling)."""

    async def pending(self) -> list[Event]:
        """The owed events, oldest first."""
        if self._events is None:
            raw = await self._storage.get_meta(OUTBOX_META)
            items = [] if raw is None else expect_list(unpack(raw, what="outbox"), "outbox")
            self._events = [Event.from_bytes(expect_bytes(b, "owed event")) for b in items]
        return list(self._events)

    async def owe(self, events: Iterable[Event]) -> tuple[tuple[str, bytes | None], ...]:
        """The meta record with ``events`` added (write it with the commit, under ``lock``)."""
        current = await self.pending()
        known = {e.id for e in current}
        return self._record([*current, *(e for e in events if e.id not in known)])

    def committed(self, record: tuple[tuple[str, bytes | None], ...]) -> None:
        """Adopt a record after the write that carried it succeeded."""
        ((_, raw),) = record
        items = [] if raw is None else expect_list(unpack(raw, what="outbox"), "outbox")
        self._events = [Event.from_bytes(expect_bytes(b, "owed event")) for b in items]

    async def settle(self, ids: Iterable[EventId]) -> None:
        """Forget events the server confirmed."""
        done = set(ids)
        async with self.lock:
            current = await self.pending()
            remaining = [e for e in current if e.id not in done]
            if len(remaining) == len(current):
                return
            record = self._record(remaining)
            await self._storage.write(WriteBatch(meta=record))
            self._events = remaining

    @staticmethod
    def _record(events: list[Event]) -> tuple[tuple[str, bytes | None], ...]:
        raw = pack([e.to_bytes() for e in events]) if events else None
        return ((OUTBOX_META, raw),)
