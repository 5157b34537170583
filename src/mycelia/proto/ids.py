"""Identifiers: :class:`EventId` and :class:`EntityId` (ARCHITECTURE.md §3).

Invariants:

- Both are exactly 32 bytes (a SHA-256 digest) and are distinct types, so a function that
  wants an entity id cannot be handed an event id by mistake (mypy enforces it).
- They order, hash and compare as their bytes (so lookups stay as fast as ``bytes``; an
  entity id equals its genesis event id, which is what it is), and print as unpadded
  URL-safe base64 (43 characters). The kinds are kept apart statically by mypy.
- An entity's id is its genesis event's id: :meth:`EntityId.of_genesis` is the one bridge.
"""

from __future__ import annotations

import base64
import binascii
from typing import Final, Self, TypeVar

from mycelia.errors import DecodeError, InvalidArgument

__all__ = ["ID_LENGTH", "EntityId", "EventId", "NodeId", "shared_entity_id", "shared_event_id"]

ID_LENGTH: Final = 32


class _Id(bytes):
    """32 bytes with a readable text form; subclasses are the distinct id kinds."""

    __slots__ = ()

    def __new__(cls, raw: bytes) -> Self:
        # Callers outside mypy's view may pass anything (a list of ints would make bytes).
        if not isinstance(raw, bytes) or len(raw) != ID_LENGTH:  # type: ignore[redundant-expr]
            raise InvalidArgument(f"{cls.__name__} needs exactly {ID_LENGTH} bytes, got {len(raw)}")
        return super().__new__(cls, raw)

    @classmethod
    def _trusted(cls, raw: bytes) -> Self:
        # For decoders that have just checked the length: skips the Python-level check,
        # which dominates the cost of decoding a clock.
        return bytes.__new__(cls, raw)

    @classmethod
    def from_base64(cls, text: str) -> Self:
        """Parse the text form; raises :class:`~mycelia.errors.DecodeError` on bad input."""
        if not isinstance(text, str) or len(text) != 43:  # type: ignore[redundant-expr]
            raise DecodeError(f"{cls.__name__} text must be 43 base64url characters: {text!r}")
        try:
            raw = base64.urlsafe_b64decode(text + "=")
        except (binascii.Error, ValueError) as exc:
            raise DecodeError(f"{cls.__name__} text is not base64url: {text!r}") from exc
        if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != text:
            raise DecodeError(f"{cls.__name__} text is not canonical base64url: {text!r}")
        return cls(raw)

    def to_base64(self) -> str:
        """The text form: unpadded URL-safe base64."""
        return base64.urlsafe_b64encode(self).rstrip(b"=").decode()

    def __str__(self) -> str:
        return self.to_base64()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_base64()[:10]}…)"


class EventId(_Id):
    """The SHA-256 of an event's canonical bytes."""

    __slots__ = ()


class EntityId(_Id):
    """An entity's id: the id of its genesis event."""

    __slots__ = ()

    @classmethod
    def of_genesis(cls, event_id: EventId) -> EntityId:
        """The id of the entity that the genesis event ``event_id`` creates."""
        return cls(bytes(event_id))

    def genesis_id(self) -> EventId:
        """The id of this entity's genesis event."""
        return EventId(bytes(self))


class NodeId(_Id):
    """A node's Ed25519 public key (raw 32 bytes)."""

    __slots__ = ()


_EVENT_IDS: dict[bytes, EventId] = {}
_ENTITY_IDS: dict[bytes, EntityId] = {}
_IDS_CAP: Final = 8192
_I = TypeVar("_I", EventId, EntityId)


def _interned(table: dict[bytes, _I], kind: type[_I], raw: bytes) -> _I:
    """The one id object of ``kind`` for ``raw`` while ``table`` remembers it (bounded:
    cleared when full). A decoded event names its parents, and with many concurrent writers
    every event names the whole head (40 parents, with 100 clients editing one text):
    without this, each decoded event held its own copy of every id it names, each tracked
    by the garbage collector, and those copies were most of what a client's full
    collections walked (20,000 of 30,000 tracked objects a client, W3's shape). The ids
    named as parents are the recent ones, so a small table serves: it holds at most
    ``_IDS_CAP`` ids of each kind, which are tracked objects too. Engines decode on
    worker threads as well: each step is one dict operation under the GIL, and a race
    only costs a second copy of an id."""
    known = table.get(raw)
    if known is None:
        if len(table) >= _IDS_CAP:
            table.clear()
        known = bytes.__new__(kind, raw)
        table[known] = known
    return known


def shared_event_id(raw: bytes) -> EventId:
    """The shared :class:`EventId` object for ``raw`` (see :func:`_interned`)."""
    known = _EVENT_IDS.get(raw)  # a recent id (a W3 event names ~9 parents): one call
    return known if known is not None else _interned(_EVENT_IDS, EventId, raw)


def shared_entity_id(raw: bytes) -> EntityId:
    """The shared :class:`EntityId` object for ``raw`` (see :func:`_interned`)."""
    known = _ENTITY_IDS.get(raw)
    return known if known is not None else _interned(_ENTITY_IDS, EntityId, raw)
