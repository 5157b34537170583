"""The gossip durable simulated nodes replicate with, as canonical bytes.

Durable nodes of a simulation replicate among themselves by gossip (a deployment scales
out on one shared database instead; nothing of this is part of the product). Clients —
ephemeral nodes — speak the real peering protocol (:mod:`mycelia.proto.peering`, over
:mod:`mycelia.testing.links`). Every gossip message is encoded here when sent and decoded
when delivered, so every event a node receives has gone through
:meth:`~mycelia.proto.Event.from_bytes` (ids recomputed, limits enforced) exactly as if it
had come off a socket.

Vocabulary:

- :class:`Push` — events, parents first (after a local commit, or answering a want/digest);
- :class:`Want` — event ids the sender misses (parents of events it holds pending);
- :class:`Digest` — "what I have": the sender's head of every entity it holds; the
  receiver pushes back what the sender lacks (and, when ``reply`` is set and the digest
  shows the sender holds something it lacks, answers with its own digest).

Invariants: encoding is deterministic (ids sorted where order carries no meaning), so a
seeded run produces the same bytes every time; :func:`decode` raises only
:class:`~mycelia.errors.DecodeError` subclasses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, TypeVar

from mycelia.errors import InvalidMessage
from mycelia.proto import DEFAULT_LIMITS, Clock, EntityId, Event, EventId, Limits
from mycelia.proto.codec import expect_bytes, expect_list, pack, unpack
from mycelia.proto.ids import ID_LENGTH
from mycelia.proto.messages import decode_events, encode_events

__all__ = ["Digest", "Push", "SimMessage", "Want", "decode", "encode"]

_PUSH: Final = 1
_WANT: Final = 2
_DIGEST: Final = 3

_IdT = TypeVar("_IdT", EntityId, EventId)


@dataclass(frozen=True, slots=True)
class Push:
    """Events for the receiver to ingest (parents first)."""

    events: tuple[Event, ...]


@dataclass(frozen=True, slots=True)
class Want:
    """Event ids the sender is missing."""

    ids: tuple[EventId, ...]


@dataclass(frozen=True, slots=True)
class Digest:
    """The sender's head of each entity it holds (sorted by entity id)."""

    heads: tuple[tuple[EntityId, Clock], ...]
    reply: bool = True


SimMessage = Push | Want | Digest


def encode(msg: SimMessage) -> bytes:
    """The canonical bytes of ``msg``."""
    if isinstance(msg, Push):
        return pack([_PUSH, encode_events(msg.events)])
    if isinstance(msg, Want):
        return pack([_WANT, sorted(bytes(i) for i in msg.ids)])
    # One bytes string per entity: its id, then its head's ids (32 bytes each).
    heads = [b"".join((e, *head)) for e, head in msg.heads]
    return pack([_DIGEST, heads, msg.reply])


def decode(data: bytes, *, limits: Limits = DEFAULT_LIMITS) -> SimMessage:
    """Decode :func:`encode`'s output; raises DecodeError for anything else."""
    fields = expect_list(unpack(data, limits=limits, what="simulated message"), "message")
    if not fields:
        raise InvalidMessage("an empty message")
    tag, *rest = fields
    if tag == _PUSH and len(rest) == 1:
        return Push(tuple(decode_events(rest[0], limits)))
    if tag == _WANT and len(rest) == 1:
        return Want(tuple(_ids(rest[0], limits, EventId)))
    if tag == _DIGEST and len(rest) == 2 and isinstance(rest[1], bool):
        return Digest(
            tuple(_digest_entry(i, limits) for i in _digest_items(rest[0], limits)), rest[1]
        )
    raise InvalidMessage(f"not a simulated message (tag {tag!r}, {len(rest)} fields)")


def _digest_items(raw: object, limits: Limits) -> list[bytes]:
    items = expect_list(raw, "digest", max_len=limits.max_batch_events)
    return [expect_bytes(i, "digest entry") for i in items]


def _digest_entry(item: bytes, limits: Limits) -> tuple[EntityId, Clock]:
    width = len(item) // ID_LENGTH - 1
    if len(item) % ID_LENGTH or not 1 <= width <= limits.max_clock_width:
        raise InvalidMessage(f"a digest entry of {len(item)} bytes")
    ids = [item[i : i + ID_LENGTH] for i in range(ID_LENGTH, len(item), ID_LENGTH)]
    return EntityId._trusted(item[:ID_LENGTH]), Clock(EventId._trusted(i) for i in ids)


def _ids(raw: object, limits: Limits, kind: type[_IdT]) -> list[_IdT]:
    items = expect_list(raw, "ids", max_len=limits.max_batch_events)
    return [kind._trusted(expect_bytes(i, "id", length=ID_LENGTH)) for i in items]
