"""One entity's delta (what a responder sends about it) and the decoding of many at once.

A subscription's answer carries a thousand deltas per frame for a fresh client, and a
pushed update a few; :data:`DELTAS` decodes each delta in the common shape in one step
(:func:`_plain_delta`) and any other through ``Delta.from_wire``, field by field, with the
errors that say what is wrong. The messages that carry deltas are in
:mod:`mycelia.proto.peering`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Final

from mycelia.errors import DecodeError
from mycelia.proto.codec import array_header, expect_list, pack, valid_names
from mycelia.proto.event import Event
from mycelia.proto.ids import ID_LENGTH, EntityId, EventId, shared_entity_id
from mycelia.proto.limits import Limits
from mycelia.proto.schema import (
    BOOL,
    CLOCK,
    ENTITY_ID,
    EVENTS,
    NAME,
    STATE,
    Optional,
    Record,
    record,
    wire,
)
from mycelia.proto.state import EntityState, plain_entity_state

__all__ = ["DELTAS", "Delta", "encode_deltas"]


@record
class Delta(Record):
    """What a responder sends about one entity: a snapshot and/or events, and membership.

    ``matches`` is False when the entity no longer satisfies the query it is sent for (the
    receiver removes it from the query's results); ``state`` and ``events`` may both be
    empty then. ``base``, only with a ``state``, is the head the receiver said it holds
    when the responder found that the state strictly descends from it: a receiver that
    still holds exactly that head and trusts the responder (an ephemeral node and its
    durable peer) takes the state without walking the history between the two.
    """

    entity_id: EntityId = wire(ENTITY_ID)
    collection: str = wire(NAME)
    matches: bool = wire(BOOL)
    state: EntityState | None = wire(Optional(STATE))
    events: tuple[Event, ...] = wire(EVENTS)
    base: tuple[EventId, ...] | None = wire(Optional(CLOCK), default=None)

    def wire_size(self) -> int:
        """An upper bound of this delta's encoded size (what it takes of a frame)."""
        size = 64 + len(self.collection)
        if self.events:
            size += sum([len(e.to_bytes()) + 5 for e in self.events])
        if self.state is not None:
            size += self.state.wire_size()
        return size + 39 * len(self.base or ())

    def check_decoded(self) -> None:
        """Raises DecodeError for a base without a state."""
        if self.base is not None and self.state is None:
            raise DecodeError("a delta's base comes only with a state")


@dataclass(frozen=True, slots=True)
class _Deltas:
    """Deltas, at most ``max_batch_events`` of them: each in the common shape (see
    :func:`_plain_delta`) decoded in one step, any other through ``Delta.from_wire``, field
    by field, with the errors that say what is wrong. A fresh client's sync decodes a
    thousand per frame; the checked path spent half its decoding in calls per field."""

    plain: ClassVar[bool] = False

    def encode(self, value: tuple[Delta, ...]) -> object:
        return [d.to_wire() for d in value]

    def decode(self, obj: object, what: str, limits: Limits) -> tuple[Delta, ...]:
        items = expect_list(obj, what, max_len=limits.max_batch_events)
        names = valid_names(limits)
        out = []
        for item in items:
            delta = _plain_delta(item, names, limits)
            out.append(delta if delta is not None else Delta.from_wire(item, limits))
        return tuple(out)


def _plain_delta(obj: object, names: set[str], limits: Limits) -> Delta | None:
    """``Delta.from_wire`` of ``obj`` in the common shape: a known collection, a boolean
    ``matches``, no state or one :func:`~mycelia.proto.state.plain_entity_state` takes, a
    list of events (decoded as ever: each re-hashed) and no base; ``None`` for any other
    shape. (A subscription's answer holds states, a pushed update events.)"""
    if type(obj) is not list or len(obj) != 6:
        return None
    entity, collection, matches, raw_state, raw_events, base = obj
    if type(entity) is not bytes or len(entity) != ID_LENGTH:
        return None
    if type(collection) is not str or collection not in names or type(matches) is not bool:
        return None
    if base is not None or type(raw_events) is not list:
        return None
    if raw_state is None:
        state = None
    else:
        state = plain_entity_state(raw_state, names, limits.max_clock_width)
        if state is None:
            return None
    events = EVENTS.decode(raw_events, "Delta.events", limits) if raw_events else ()
    return Delta(shared_entity_id(entity), collection, matches, state, events)


DELTAS: Final = _Deltas()


def encode_deltas(deltas: tuple[Delta, ...]) -> bytes:
    """``pack(DELTAS.encode(deltas))``, with each state that knows its bytes
    (``EntityState.wire``: a durable engine's, as stored) spliced in as they are: a fresh
    client's answer is a thousand stored states, which the responder decoded only to read
    their heads. (msgpack is concatenative: an array is its header, then its items.)"""
    out = [array_header(len(deltas))]
    for delta in deltas:
        state = delta.state
        wire = None if state is None else state.wire
        if wire is None or delta.events or delta.base is not None:
            out.append(pack(delta.to_wire()))
            continue
        head = pack([delta.entity_id, delta.collection, delta.matches])
        out.append(b"\x96" + head[1:] + wire + b"\x90\xc0")  # 6 items: ..., [], None
    return b"".join(out)
