"""What a write's ``NOTIFY`` on the feed's channel says (ARCHITECTURE.md §6).

The payload is ``"<last offset> <writer>"``, then, when they fit in :data:`NOTICE_BYTES`,
the feed rows the write appended, in offset order (the last one at ``<last offset>``)::

    <last> <writer> <collection>/<entity>/<head>;...[ <generation>/<event>;...]

with the entity id, the head's concatenated ids and each event's canonical bytes in
URL-safe base64; the events, when they fit too, are the write's events its rows' heads
name. Collection names are letters, digits, ``_ . -``
(:data:`mycelia.proto.codec.NAME_PATTERN`), so no separator can occur in one.

A listener that heard a write's rows knows them without reading the feed: a follower that
shows none of their collections skips them without a query (:mod:`mycelia.node.feed`
evicts their entities and reports nothing), and one that shows them, once it holds the
events their heads name, reports them without a query either. A payload without rows (a
big write, or an engine of an older version) is still a wake-up, and a reader reads what
it did not hear; so is a lost notification. A payload is parsed defensively: whatever
does not parse gives no rows (or no events), never an error; an event's id is its bytes'
hash, recomputed as it is decoded, so a row's head names only the event it is.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from mycelia.errors import DecodeError
from mycelia.proto import AdmittedEvent, EntityId, Event
from mycelia.proto.codec import NAME_PATTERN
from mycelia.proto.ids import ID_LENGTH
from mycelia.storage.engine import STORED_LIMITS, FeedEntry
from mycelia.storage.postgres_sql import clock

__all__ = ["NOTICE_BYTES", "Notice", "notice", "parse_notice"]

NOTICE_BYTES: Final = 7_900
"""Most bytes of a payload (PostgreSQL refuses one of 8,000 or more)."""
_OFFSET_DIGITS: Final = 20
"""Room for the offset the statement puts first (a bigint)."""


@dataclass(frozen=True, slots=True)
class Notice:
    """One parsed notification."""

    last: int
    writer: str
    rows: tuple[FeedEntry, ...] | None
    """The write's feed rows, ending at ``last`` (``None``: not said)."""
    events: tuple[AdmittedEvent, ...] = ()
    """Events the rows' heads name (as many as were said)."""


def notice(
    writer: str,
    rows: Sequence[tuple[bytes, str, bytes]],
    events: Sequence[AdmittedEvent] = (),
) -> str:
    """What follows ``<last offset> `` in the payload of a write by ``writer`` that
    appends ``rows`` (entity id, collection, concatenated head ids) to the feed, with
    those of its ``events`` the heads name when they fit (the offsets are taken in the
    write's own statement, which puts the payload together)."""
    said = ";".join(f"{c}/{_b64(e)}/{_b64(h)}" for e, c, h in rows)
    room = NOTICE_BYTES - _OFFSET_DIGITS - len(writer) - 2
    if not said or len(said) > room:
        return writer
    heads = {h[i : i + ID_LENGTH] for _, _, h in rows for i in range(0, len(h), ID_LENGTH)}
    named = ";".join(
        f"{e.generation}/{_b64(e.event.to_bytes())}" for e in events if bytes(e.id) in heads
    )
    if named and len(said) + 1 + len(named) <= room:
        return f"{writer} {said} {named}"
    return f"{writer} {said}"


def parse_notice(payload: str, *, own: str | None = None) -> Notice | None:
    """``payload`` as a :class:`Notice` (``None``: not even an offset). The events of a
    write by ``own`` are not decoded (a listener's own writes: its engine holds them, and
    decoding them is most of a notice's cost)."""
    head, _, rest = payload.partition(" ")
    try:
        last = int(head)
    except ValueError:
        return None
    writer, _, said = rest.partition(" ")
    said, _, named = said.partition(" ")
    rows = _rows(last, said) if said else None
    events = _events(named) if rows and named and writer != own else ()
    return Notice(last, writer, rows, events)


def _rows(last: int, said: str) -> tuple[FeedEntry, ...] | None:
    parts = said.split(";")
    rows = []
    for offset, part in enumerate(parts, start=last - len(parts) + 1):
        fields = part.split("/")
        if len(fields) != 3 or not NAME_PATTERN.match(fields[0]):
            return None
        try:
            entity, head = _unb64(fields[1]), _unb64(fields[2])
        except (binascii.Error, ValueError):
            return None
        if len(entity) != ID_LENGTH or not head or len(head) % ID_LENGTH:
            return None
        rows.append(FeedEntry(offset, EntityId._trusted(entity), fields[0], clock(head)))
    return tuple(rows)


def _events(named: str) -> tuple[AdmittedEvent, ...]:
    events = []
    for part in named.split(";"):
        generation, _, body = part.partition("/")
        try:
            event, gen = Event.from_bytes(_unb64(body), limits=STORED_LIMITS), int(generation)
        except (DecodeError, binascii.Error, ValueError):
            return ()
        if gen < 1:
            return ()
        events.append(AdmittedEvent(event, gen))
    return tuple(events)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text.encode("ascii"))
