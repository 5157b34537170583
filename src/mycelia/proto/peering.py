"""The peer-to-peer vocabulary: handshake, requests, responses and pushed updates.

Every class here is a registered :class:`~mycelia.proto.messages.Message`; tags are the
wire contract (never reuse or renumber one). The session that speaks them, with its
transition table, is :mod:`mycelia.node.session`.

Handshake (ARCHITECTURE.md §7): the first frame each way is a :class:`Presence` carrying
the sender's Ed25519 public key (its node id), durable flag, system root, protocol version
and a fresh random challenge; the second frame each way is a :class:`PresenceProof`: the
sender's signature over the peer's challenge (bound to both node ids) and, from a client,
its credentials token. A version mismatch is answered with :class:`PresenceRejected` and a
close.

Requests carry a ``request_id`` chosen by the requester; the answer is exactly one
response with that id: the request's own response type, :class:`Ack`, or
:class:`ErrorResponse`. Events travel as canonical bytes and are re-verified on decode;
states as :class:`~mycelia.proto.EntityState` wire arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Self

from mycelia.errors import DecodeError, PayloadTooLarge
from mycelia.proto.codec import (
    expect_bytes,
    expect_int,
    expect_list,
    expect_name,
    expect_optional_bytes,
    expect_str,
)
from mycelia.proto.event import Event
from mycelia.proto.ids import ID_LENGTH, EntityId, EventId, NodeId
from mycelia.proto.limits import Limits
from mycelia.proto.messages import Message, decode_events, message
from mycelia.proto.state import EntityState

__all__ = [
    "CHALLENGE_LENGTH",
    "SIGNATURE_LENGTH",
    "Ack",
    "CommitRequest",
    "Delta",
    "DeltasResponse",
    "ErrorResponse",
    "EventsResponse",
    "FetchRequest",
    "GetEventsRequest",
    "GetRequest",
    "KnownEntity",
    "Presence",
    "PresenceProof",
    "PresenceRejected",
    "SubscribeRequest",
    "SubscriptionUpdate",
    "SystemRequest",
    "UnsubscribeRequest",
]

CHALLENGE_LENGTH: Final = 32
SIGNATURE_LENGTH: Final = 64
MAX_TOKEN: Final = 8192
MAX_QUERY_TEXT: Final = 64 * 1024


def _bool(obj: object, what: str) -> bool:
    if not isinstance(obj, bool):
        expect_int(obj, what)  # raises with a clear message
    return bool(obj)


def _entity(obj: object, what: str) -> EntityId:
    return EntityId._trusted(expect_bytes(obj, what, length=ID_LENGTH))


def _event_id(obj: object, what: str) -> EventId:
    return EventId._trusted(expect_bytes(obj, what, length=ID_LENGTH))


def _rid(obj: object) -> int:
    return expect_int(obj, "request id", minimum=0)


@message(1)
@dataclass(frozen=True, slots=True)
class Presence(Message):
    """The first frame each way: who the sender is and a challenge for the peer to sign."""

    node_id: NodeId
    durable: bool
    system_root: EntityId | None
    protocol_version: int
    challenge: bytes

    def to_wire(self) -> list[object]:
        return [self.node_id, self.durable, self.system_root, self.protocol_version, self.challenge]

    @classmethod
    def from_wire(cls, fields: list[object], limits: Limits) -> Self:
        node, durable, root, version, challenge = expect_list(fields, "Presence", length=5)
        return cls(
            NodeId(expect_bytes(node, "node id", length=ID_LENGTH)),
            _bool(durable, "durable"),
            None if root is None else _entity(root, "system root"),
            expect_int(version, "protocol version", minimum=0),
            expect_bytes(challenge, "challenge", length=CHALLENGE_LENGTH),
        )


@message(2)
@dataclass(frozen=True, slots=True)
class PresenceProof(Message):
    """The second frame each way: a signature over the peer's challenge, and credentials."""

    signature: bytes
    token: bytes | None = None

    def to_wire(self) -> list[object]:
        return [self.signature, self.token]

    @classmethod
    def from_wire(cls, fields: list[object], limits: Limits) -> Self:
        signature, token = expect_list(fields, "PresenceProof", length=2)
        token_bytes = expect_optional_bytes(token, "token")
        if token_bytes is not None and len(token_bytes) > MAX_TOKEN:
            raise PayloadTooLarge(f"a token is at most {MAX_TOKEN} bytes")
        return cls(expect_bytes(signature, "signature", length=SIGNATURE_LENGTH), token_bytes)


@message(3)
@dataclass(frozen=True, slots=True)
class PresenceRejected(Message):
    """Sent before closing when the peer's Presence cannot be accepted."""

    reason: str
    expected_version: int
    received_version: int

    def to_wire(self) -> list[object]:
        return [self.reason, self.expected_version, self.received_version]

    @classmethod
    def from_wire(cls, fields: list[object], limits: Limits) -> Self:
        reason, expected, received = expect_list(fields, "PresenceRejected", length=3)
        return cls(
            expect_str(reason, "reason", max_len=1024),
            expect_int(expected, "expected version", minimum=0),
            expect_int(received, "received version", minimum=0),
        )


@dataclass(frozen=True, slots=True)
class KnownEntity:
    """What a requester already holds of an entity: its head."""

    entity_id: EntityId
    head: tuple[EventId, ...]

    def to_wire(self) -> list[object]:
        return [self.entity_id, list(self.head)]

    @classmethod
    def from_wire(cls, obj: object, limits: Limits) -> KnownEntity:
        entity, head = expect_list(obj, "known entity", length=2)
        ids = expect_list(head, "known head", max_len=limits.max_clock_width)
        return cls(_entity(entity, "entity id"), tuple(_event_id(i, "head id") for i in ids))


def _known(obj: object, limits: Limits) -> tuple[KnownEntity, ...]:
    items = expect_list(obj, "known entities", max_len=limits.max_batch_events)
    return tuple(KnownEntity.from_wire(i, limits) for i in items)


@dataclass(frozen=True, slots=True)
class Delta:
    """What a responder sends about one entity: a snapshot and/or events, and membership.

    ``matches`` is False when the entity no longer satisfies the query it is sent for (the
    receiver removes it from the query's results); ``state`` and ``events`` may both be
    empty then. ``base``, only with a ``state``, is the head the receiver said it holds
    when the responder found that the state strictly descends from it: a receiver that
    still holds exactly that head and trusts the responder (an ephemeral node and its
    durable peer) takes the state without walking the history between the two.
    """

    entity_id: EntityId
    collection: str
    matches: bool
    state: EntityState | None
    events: tuple[Event, ...]
    base: tuple[EventId, ...] | None = None

    def to_wire(self) -> list[object]:
        state = None if self.state is None else self.state.to_wire()
        events = [e.to_bytes() for e in self.events]
        base = None if self.base is None else list(self.base)
        return [self.entity_id, self.collection, self.matches, state, events, base]

    @classmethod
    def from_wire(cls, obj: object, limits: Limits) -> Delta:
        entity, collection, matches, state, events, base = expect_list(obj, "delta", length=6)
        entity_id = _entity(entity, "entity id")
        name = expect_name(collection, "collection", limits=limits)
        decoded_state = None if state is None else EntityState.from_wire(state, limits=limits)
        decoded_events = tuple(decode_events(events, limits, what="delta events"))
        decoded_base = None
        if base is not None:
            if decoded_state is None:
                raise DecodeError("a delta's base comes only with a state")
            ids = expect_list(base, "delta base", max_len=limits.max_clock_width)
            decoded_base = tuple(_event_id(i, "base id") for i in ids)
        return cls(
            entity_id, name, _bool(matches, "matches"), decoded_state, decoded_events, decoded_base
        )


def _deltas(obj: object, limits: Limits) -> tuple[Delta, ...]:
    items = expect_list(obj, "deltas", max_len=limits.max_batch_events)
    return tuple(Delta.from_wire(i, limits) for i in items)


def _args(obj: object) -> tuple[object, ...]:
    return tuple(expect_list(obj, "query arguments", max_len=256))


@message(10)
@dataclass(frozen=True, slots=True)
class GetRequest(Message):
    """Ask for the current state of entities by id, answered by :class:`DeltasResponse`.

    ``known`` lets the responder send only what is missing (and say when its state
    descends from what the requester holds); unknown or unreadable ids are absent.
    """

    request_id: int
    entity_ids: tuple[EntityId, ...]
    known: tuple[KnownEntity, ...] = ()

    def to_wire(self) -> list[object]:
        return [self.request_id, list(self.entity_ids), [k.to_wire() for k in self.known]]

    @classmethod
    def from_wire(cls, fields: list[object], limits: Limits) -> Self:
        rid, ids, known = expect_list(fields, "GetRequest", length=3)
        items = expect_list(ids, "entity ids", max_len=limits.max_batch_events)
        entity_ids = tuple(_entity(i, "entity id") for i in items)
        return cls(_rid(rid), entity_ids, _known(known, limits))


@message(11)
@dataclass(frozen=True, slots=True)
class GetEventsRequest(Message):
    """Ask for events by id, plus up to ``ahead`` of their ancestors."""

    request_id: int
    event_ids: tuple[EventId, ...]
    ahead: int = 0

    def to_wire(self) -> list[object]:
        return [self.request_id, list(self.event_ids), self.ahead]

    @classmethod
    def from_wire(cls, fields: list[object], limits: Limits) -> Self:
        rid, ids, ahead = expect_list(fields, "GetEventsRequest", length=3)
        items = expect_list(ids, "event ids", max_len=limits.max_batch_events)
        return cls(
            _rid(rid),
            tuple(_event_id(i, "event id") for i in items),
            min(expect_int(ahead, "ahead", minimum=0), limits.max_batch_events),
        )


@message(12)
@dataclass(frozen=True, slots=True)
class FetchRequest(Message):
    """A one-shot query; ``known`` lets the responder send only what is missing."""

    request_id: int
    collection: str
    query: str
    args: tuple[object, ...]
    known: tuple[KnownEntity, ...]

    def to_wire(self) -> list[object]:
        known = [k.to_wire() for k in self.known]
        return [self.request_id, self.collection, self.query, list(self.args), known]

    @classmethod
    def from_wire(cls, fields: list[object], limits: Limits) -> Self:
        rid, collection, query, args, known = expect_list(fields, "FetchRequest", length=5)
        return cls(
            _rid(rid),
            expect_name(collection, "collection", limits=limits),
            expect_str(query, "query", max_len=MAX_QUERY_TEXT),
            _args(args),
            _known(known, limits),
        )


@message(13)
@dataclass(frozen=True, slots=True)
class SubscribeRequest(Message):
    """Start (or replace) a standing query; answered like a fetch, then updates follow."""

    request_id: int
    query_id: int
    collection: str
    query: str
    args: tuple[object, ...]
    known: tuple[KnownEntity, ...]

    def to_wire(self) -> list[object]:
        known = [k.to_wire() for k in self.known]
        fields = [self.request_id, self.query_id, self.collection, self.query]
        return [*fields, list(self.args), known]

    @classmethod
    def from_wire(cls, fields: list[object], limits: Limits) -> Self:
        rid, qid, collection, query, args, known = expect_list(fields, "SubscribeRequest", length=6)
        return cls(
            _rid(rid),
            expect_int(qid, "query id", minimum=0),
            expect_name(collection, "collection", limits=limits),
            expect_str(query, "query", max_len=MAX_QUERY_TEXT),
            _args(args),
            _known(known, limits),
        )


@message(14)
@dataclass(frozen=True, slots=True)
class UnsubscribeRequest(Message):
    """Stop a standing query: the responder stops pushing its updates."""

    request_id: int
    query_id: int

    def to_wire(self) -> list[object]:
        return [self.request_id, self.query_id]

    @classmethod
    def from_wire(cls, fields: list[object], limits: Limits) -> Self:
        rid, qid = expect_list(fields, "UnsubscribeRequest", length=2)
        return cls(_rid(rid), expect_int(qid, "query id", minimum=0))


@message(15)
@dataclass(frozen=True, slots=True)
class CommitRequest(Message):
    """Commit events made elsewhere (all-or-nothing on the responder)."""

    request_id: int
    events: tuple[Event, ...]

    def to_wire(self) -> list[object]:
        return [self.request_id, [e.to_bytes() for e in self.events]]

    @classmethod
    def from_wire(cls, fields: list[object], limits: Limits) -> Self:
        rid, events = expect_list(fields, "CommitRequest", length=2)
        return cls(_rid(rid), tuple(decode_events(events, limits)))


@message(16)
@dataclass(frozen=True, slots=True)
class SystemRequest(Message):
    """Ask for the events that define the responder's system (its root)."""

    request_id: int

    def to_wire(self) -> list[object]:
        return [self.request_id]

    @classmethod
    def from_wire(cls, fields: list[object], limits: Limits) -> Self:
        (rid,) = expect_list(fields, "SystemRequest", length=1)
        return cls(_rid(rid))


@message(20)
@dataclass(frozen=True, slots=True)
class ErrorResponse(Message):
    """A request failed on the peer: ``kind`` is the error class name there."""

    request_id: int
    kind: str
    text: str

    def to_wire(self) -> list[object]:
        return [self.request_id, self.kind, self.text]

    @classmethod
    def from_wire(cls, fields: list[object], limits: Limits) -> Self:
        rid, kind, text = expect_list(fields, "ErrorResponse", length=3)
        return cls(
            _rid(rid),
            expect_str(kind, "error kind", max_len=64),
            expect_str(text, "error text", max_len=4096),
        )


@message(21)
@dataclass(frozen=True, slots=True)
class Ack(Message):
    """A request succeeded and has nothing to return."""

    request_id: int

    def to_wire(self) -> list[object]:
        return [self.request_id]

    @classmethod
    def from_wire(cls, fields: list[object], limits: Limits) -> Self:
        (rid,) = expect_list(fields, "Ack", length=1)
        return cls(_rid(rid))


# Tag 22 (StatesResponse, protocol 1) is retired: GetRequest is answered with deltas.


@message(23)
@dataclass(frozen=True, slots=True)
class EventsResponse(Message):
    """Events answering :class:`GetEventsRequest` or :class:`SystemRequest`.

    ``generations`` (one per event, or empty) are the responder's generations: a receiver
    that holds an event's parents recomputes and checks it; one that does not (an
    ephemeral node walking history it never held) uses it to order its walk.
    """

    request_id: int
    events: tuple[Event, ...]
    generations: tuple[int, ...] = ()

    def to_wire(self) -> list[object]:
        return [self.request_id, [e.to_bytes() for e in self.events], list(self.generations)]

    @classmethod
    def from_wire(cls, fields: list[object], limits: Limits) -> Self:
        rid, events, generations = expect_list(fields, "EventsResponse", length=3)
        decoded = tuple(decode_events(events, limits))
        gens = expect_list(generations, "generations", max_len=len(decoded))
        if gens and len(gens) != len(decoded):
            raise DecodeError("an events response needs one generation per event, or none")
        return cls(_rid(rid), decoded, tuple(expect_int(g, "generation", minimum=1) for g in gens))


@message(24)
@dataclass(frozen=True, slots=True)
class DeltasResponse(Message):
    """Per-entity deltas answering :class:`FetchRequest` or :class:`SubscribeRequest`."""

    request_id: int
    deltas: tuple[Delta, ...]

    def to_wire(self) -> list[object]:
        return [self.request_id, [d.to_wire() for d in self.deltas]]

    @classmethod
    def from_wire(cls, fields: list[object], limits: Limits) -> Self:
        rid, deltas = expect_list(fields, "DeltasResponse", length=2)
        return cls(_rid(rid), _deltas(deltas, limits))


@message(30)
@dataclass(frozen=True, slots=True)
class SubscriptionUpdate(Message):
    """Pushed to a subscriber: what changed for one of its standing queries."""

    query_id: int
    deltas: tuple[Delta, ...]

    def to_wire(self) -> list[object]:
        return [self.query_id, [d.to_wire() for d in self.deltas]]

    @classmethod
    def from_wire(cls, fields: list[object], limits: Limits) -> Self:
        qid, deltas = expect_list(fields, "SubscriptionUpdate", length=2)
        return cls(expect_int(qid, "query id", minimum=0), _deltas(deltas, limits))
