"""Wire messages: typed frames and the one dispatcher that decodes them (ARCHITECTURE.md §7).

Invariants:

- A frame is one msgpack array ``[tag, field, ...]``; ``tag`` names the message class.
  Every message class registers its tag once with :func:`message`, which also makes it a
  :class:`~mycelia.proto.schema.Record`: its fields, declared with
  :func:`~mycelia.proto.schema.wire`, are its schema, and the fields of a frame are
  encoded and decoded from that declaration alone. :func:`decode_frame` is the only way
  bytes become a message: an unknown tag, a wrong field count or a wrongly typed field is
  an :class:`~mycelia.errors.InvalidMessage` (or another
  :class:`~mycelia.errors.DecodeError`), never a ``dict`` or a half-built object.
- Messages are frozen values. Events travel as their canonical bytes and are re-verified
  (ids recomputed) by :func:`decode_events`; batches are capped by the limits.
- The peer-to-peer vocabulary (handshake, requests, responses, updates) lives in
  :mod:`mycelia.proto.peering`; this module is the framing they share.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
from typing import ClassVar, Final, TypeVar, dataclass_transform

from mycelia.errors import DecodeError, InvalidArgument, InvalidMessage
from mycelia.proto.codec import COUNTED_PAYLOAD, expect_int, pack, unpack
from mycelia.proto.event import Event
from mycelia.proto.limits import DEFAULT_LIMITS, Limits
from mycelia.proto.schema import EVENTS, Record, record, wire

__all__ = [
    "PROTOCOL_VERSION",
    "Message",
    "decode_events",
    "decode_fields",
    "decode_frame",
    "encode_events",
    "encode_frame",
    "message",
    "message_type",
    "message_types",
    "peek",
    "unpack_frame",
]

PROTOCOL_VERSION: Final = 4
"""Peers must speak exactly the same version (ARCHITECTURE.md §7; the versioning rule is in
``docs/protocol.md``: any change to a frame's bytes or meaning bumps it).

2: ``GetRequest`` carries known heads and is answered with deltas; a delta may carry the
``base`` its snapshot descends from.
3: the proofs bind both challenges, the direction and the version, and the dialer signs
only once it verified the listener's; errors travel as stable codes; answers are paged
(``DeltasPage``, ``EventsPage``) under the frame limit; ``SubscriptionEnded``.
4: ``CommitsRequest`` carries several commits in one frame, answered by one
``VerdictsResponse`` with a verdict per commit.
"""


class Message(Record):
    """Base of every wire message: a frozen :class:`~mycelia.proto.schema.Record` with a tag.

    ``to_wire`` / ``from_wire`` (the frame's fields after the tag) come from the schema.
    """

    __slots__ = ()
    TAG: ClassVar[int]

    def to_frame(self) -> bytes:
        """The bytes of one frame carrying this message (a message class whose fields
        hold bytes already encoded may splice them in: the same bytes, encoded once)."""
        return pack([self.TAG, *self.to_wire()])


_REGISTRY: dict[int, type[Message]] = {}


M = TypeVar("M", bound=Message)


@dataclass_transform(frozen_default=True, field_specifiers=(wire,))
def message(tag: int) -> Callable[[type[M]], type[M]]:
    """Class decorator: make a message class a :func:`~mycelia.proto.schema.record` and
    register it under ``tag`` (each tag once; raises InvalidArgument for a taken one)."""

    def register(cls: type[M]) -> type[M]:
        if tag in _REGISTRY:
            raise InvalidArgument(f"message tag {tag} is taken by {_REGISTRY[tag].__name__}")
        built = record(cls)
        built.TAG = tag
        _REGISTRY[tag] = built
        return built

    return register


def message_types() -> dict[int, type[Message]]:
    """Every registered message class by tag (a copy)."""
    return dict(_REGISTRY)


def message_type(tag: int | None) -> type[Message] | None:
    """The message class registered under ``tag`` (``None`` if there is none)."""
    return None if tag is None else _REGISTRY.get(tag)


def encode_frame(msg: Message) -> bytes:
    """The bytes of one frame carrying ``msg``."""
    return msg.to_frame()


def peek(frame: bytes) -> tuple[int | None, int | None]:
    """A frame's tag and its first field when that is an integer (a request id), read from
    its first bytes without decoding the rest: what a receiver checks before it spends
    anything on the body. ``(None, None)`` if the frame does not start like a message."""
    # Read by hand: a msgpack Unpacker is a 41 KiB object (its parse stack; a bare one
    # also allocates a 1 MiB buffer), made for every frame a server took.
    array = _array_body(frame)
    if array is None:
        return None, None
    length, at = array
    read = _int_at(frame, at)
    if read is None:
        return None, None
    tag, at = read
    first = _int_at(frame, at) if length >= 2 else None
    return tag, None if first is None else first[0]


def _array_body(frame: bytes) -> tuple[int, int] | None:
    """(length, offset of the first item) of the array ``frame`` starts with (non-empty)."""
    if not frame:
        return None
    head = frame[0]
    if 0x91 <= head <= 0x9F:
        return head & 0x0F, 1
    size = _ARRAY_HEADERS.get(head)
    if size is None or len(frame) < 1 + size:
        return None
    length = int.from_bytes(frame[1 : 1 + size], "big")
    return (length, 1 + size) if length >= 1 else None


def _int_at(frame: bytes, at: int) -> tuple[int, int] | None:
    """(value, offset after it) of the msgpack integer at ``at``; None if there is none."""
    if at >= len(frame):
        return None
    head = frame[at]
    if head <= 0x7F:
        return head, at + 1
    if head >= 0xE0:
        return head - 0x100, at + 1
    form = _INT_FORMS.get(head)
    if form is None or len(frame) < at + 1 + form[0]:
        return None
    size, signed = form
    value = int.from_bytes(frame[at + 1 : at + 1 + size], "big", signed=signed)
    return value, at + 1 + size


_ARRAY_HEADERS: Final = {0xDC: 2, 0xDD: 4}
"""array 16 and array 32: the bytes of their length."""
_INT_FORMS: Final = {
    0xCC: (1, False),
    0xCD: (2, False),
    0xCE: (4, False),
    0xCF: (8, False),
    0xD0: (1, True),
    0xD1: (2, True),
    0xD2: (4, True),
    0xD3: (8, True),
}
"""msgpack's sized integers: (bytes, signed)."""


def decode_frame(data: bytes, *, limits: Limits = DEFAULT_LIMITS) -> Message:
    """Decode one frame into its message class. A large frame decodes with the garbage
    collector paused, its fields as well as its msgpack (:func:`~mycelia.proto.codec.unpack`
    pauses it for the latter alone): a collection in the middle would find the frame's
    decoded arrays alive, promote them, and count them towards a full collection, though
    they are garbage a moment later (a fresh client's sync decodes thousands of states).

    Raises:
        PayloadTooLarge: beyond ``limits``.
        InvalidMessage: not a frame of this protocol.
        DecodeError: a field is malformed.
    """
    if len(data) <= COUNTED_PAYLOAD or not gc.isenabled():
        return decode_fields(unpack_frame(data, limits=limits), limits=limits)
    gc.disable()  # (by hand, as codec's is: a context manager allocates before pausing)
    try:
        return decode_fields(unpack_frame(data, limits=limits), limits=limits)
    finally:
        gc.enable()


def unpack_frame(data: bytes, *, limits: Limits = DEFAULT_LIMITS) -> list[object]:
    """The first step of :func:`decode_frame`: the frame's msgpack array (the tag first).

    Raises:
        PayloadTooLarge: beyond ``limits`` (the frame, or a length inside it).
        InvalidMessage: not a msgpack array starting with an integer tag.
        DecodeError: not msgpack.
    """
    fields = unpack(data, limits=limits, what="frame")
    if not isinstance(fields, list) or not fields:
        raise InvalidMessage("a frame is a non-empty array starting with a message tag")
    expect_int(fields[0], "message tag")
    return fields


def decode_fields(fields: list[object], *, limits: Limits = DEFAULT_LIMITS) -> Message:
    """The second step of :func:`decode_frame`: the message from its frame's array.

    Raises:
        InvalidMessage: an unknown tag, or the wrong number of fields.
        PayloadTooLarge: a field beyond its declared limit.
        DecodeError: a field is malformed.
    """
    tag = expect_int(fields[0], "message tag")
    cls = _REGISTRY.get(tag)
    if cls is None:
        raise InvalidMessage(f"unknown message tag {tag}")
    try:
        return cls.from_wire(fields[1:], limits)
    except DecodeError:
        raise
    except (TypeError, ValueError) as exc:  # a from_wire that unpacked the wrong arity
        raise InvalidMessage(f"malformed {cls.__name__}: {exc}") from exc


def encode_events(events: Iterable[Event]) -> list[bytes]:
    """Events as a list of their canonical bytes (the wire form of a batch)."""
    return [e.to_bytes() for e in events]


def decode_events(raw: object, limits: Limits, *, what: str = "events") -> list[Event]:
    """Decode a batch of events, each re-hashed; at most ``limits.max_batch_events``."""
    return list(EVENTS.decode(raw, what, limits))
