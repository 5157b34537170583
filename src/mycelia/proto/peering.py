"""The peer-to-peer vocabulary: handshake, requests, responses and pushed updates.

Every class here is a registered :class:`~mycelia.proto.messages.Message` whose fields are
declared with their codecs and limits (:mod:`mycelia.proto.schema`): that declaration is
the message's schema, and its encoding and decoding come from it, so a message is spelled
once. Tags are the wire contract (never reuse or renumber one); the golden frames in
``tests/proto`` pin every message's bytes. The session that speaks them, with its
transition table, is :mod:`mycelia.node.session`.

Handshake (ARCHITECTURE.md §7): the first frame each way is a :class:`Presence` carrying
the sender's Ed25519 public key (its node id), durable flag, system root, protocol version
and a fresh random challenge; the second frame each way is a :class:`PresenceProof`: the
sender's signature over the peer's challenge (bound to both node ids) and, from a client,
its credentials token. A version mismatch is answered with :class:`PresenceRejected` and a
close.

Requests carry a ``request_id`` chosen by the requester; the answer is exactly one
response with that id: one of the request's response types in :data:`RESPONSES` (the one
table of them: responders dispatch on it, requesters check answers against it with
:func:`expect_response`), or :class:`ErrorResponse`. Events travel as canonical bytes and
are re-verified on decode; states as :class:`~mycelia.proto.EntityState` wire arrays.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, TypeVar

from mycelia.errors import DecodeError, RemoteProtocolError
from mycelia.proto.event import Event
from mycelia.proto.ids import EntityId, EventId, NodeId
from mycelia.proto.messages import Message, message
from mycelia.proto.schema import (
    BOOL,
    ENTITY_ID,
    EVENT_ID,
    EVENTS,
    NAME,
    NODE_ID,
    STATE,
    Array,
    Bytes,
    Int,
    Nested,
    Optional,
    Record,
    Str,
    Values,
    record,
    wire,
)
from mycelia.proto.state import EntityState

__all__ = [
    "CHALLENGE_LENGTH",
    "REQUESTS",
    "RESPONSES",
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
    "expect_response",
]

CHALLENGE_LENGTH: Final = 32
SIGNATURE_LENGTH: Final = 64
MAX_TOKEN: Final = 8192
MAX_QUERY_TEXT: Final = 64 * 1024
MAX_QUERY_ARGS: Final = 256

REQUEST_ID: Final = Int()
QUERY_ID: Final = Int()
QUERY: Final = Str(MAX_QUERY_TEXT)
ARGS: Final = Values(MAX_QUERY_ARGS)
CLOCK: Final = Array(EVENT_ID, limit="max_clock_width")
"""A head or a base: event ids, at most a clock's width."""


@message(1)
class Presence(Message):
    """The first frame each way: who the sender is and a challenge for the peer to sign."""

    node_id: NodeId = wire(NODE_ID)
    durable: bool = wire(BOOL)
    system_root: EntityId | None = wire(Optional(ENTITY_ID))
    protocol_version: int = wire(Int())
    challenge: bytes = wire(Bytes(length=CHALLENGE_LENGTH))


@message(2)
class PresenceProof(Message):
    """The second frame each way: a signature over the peer's challenge, and credentials."""

    signature: bytes = wire(Bytes(length=SIGNATURE_LENGTH))
    token: bytes | None = wire(Optional(Bytes(max_len=MAX_TOKEN)), default=None)


@message(3)
class PresenceRejected(Message):
    """Sent before closing when the peer's Presence cannot be accepted."""

    reason: str = wire(Str(1024))
    expected_version: int = wire(Int())
    received_version: int = wire(Int())


@record
class KnownEntity(Record):
    """What a requester already holds of an entity: its head."""

    entity_id: EntityId = wire(ENTITY_ID)
    head: tuple[EventId, ...] = wire(CLOCK)


KNOWN: Final = Array(Nested(KnownEntity), limit="max_batch_events")


@message(10)
class GetRequest(Message):
    """Ask for the current state of entities by id, answered by :class:`DeltasResponse`.

    ``known`` lets the responder send only what is missing (and say when its state
    descends from what the requester holds); unknown or unreadable ids are absent.
    """

    request_id: int = wire(REQUEST_ID)
    entity_ids: tuple[EntityId, ...] = wire(Array(ENTITY_ID, limit="max_batch_events"))
    known: tuple[KnownEntity, ...] = wire(KNOWN, default=())


@message(11)
class GetEventsRequest(Message):
    """Ask for events by id, plus up to ``ahead`` of their ancestors (cut to a batch)."""

    request_id: int = wire(REQUEST_ID)
    event_ids: tuple[EventId, ...] = wire(Array(EVENT_ID, limit="max_batch_events"))
    ahead: int = wire(Int(clamp="max_batch_events"), default=0)


@message(14)
class UnsubscribeRequest(Message):
    """Stop a standing query: the responder stops pushing its updates."""

    request_id: int = wire(REQUEST_ID)
    query_id: int = wire(QUERY_ID)


@message(15)
class CommitRequest(Message):
    """Commit events made elsewhere (all-or-nothing on the responder)."""

    request_id: int = wire(REQUEST_ID)
    events: tuple[Event, ...] = wire(EVENTS)


@message(16)
class SystemRequest(Message):
    """Ask for the events that define the responder's system (its root)."""

    request_id: int = wire(REQUEST_ID)


# The query requests, then the deltas that answer them (and their pushed updates).


@message(12)
class FetchRequest(Message):
    """A one-shot query; ``known`` lets the responder send only what is missing."""

    request_id: int = wire(REQUEST_ID)
    collection: str = wire(NAME)
    query: str = wire(QUERY)
    """The query text (ARCHITECTURE.md §8), with ``?`` placeholders."""
    args: tuple[object, ...] = wire(ARGS)
    """The placeholders' values, in order."""
    known: tuple[KnownEntity, ...] = wire(KNOWN)


@message(13)
class SubscribeRequest(Message):
    """Start (or replace) a standing query; answered like a fetch, then updates follow."""

    request_id: int = wire(REQUEST_ID)
    query_id: int = wire(QUERY_ID)
    """The requester's name for this standing query: its updates carry it."""
    collection: str = wire(NAME)
    query: str = wire(QUERY)
    args: tuple[object, ...] = wire(ARGS)
    known: tuple[KnownEntity, ...] = wire(KNOWN)
    """What the requester holds already, as for a fetch."""


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

    def check_decoded(self) -> None:
        """Raises DecodeError for a base without a state."""
        if self.base is not None and self.state is None:
            raise DecodeError("a delta's base comes only with a state")


DELTAS: Final = Array(Nested(Delta), limit="max_batch_events")


@message(20)
class ErrorResponse(Message):
    """A request failed on the peer: ``kind`` is the error class name there."""

    request_id: int = wire(REQUEST_ID)
    kind: str = wire(Str(64))
    text: str = wire(Str(4096))


@message(21)
class Ack(Message):
    """A request succeeded and has nothing to return."""

    request_id: int = wire(REQUEST_ID)


# Tag 22 (StatesResponse, protocol 1) is retired: GetRequest is answered with deltas.


@message(23)
class EventsResponse(Message):
    """Events answering :class:`GetEventsRequest` or :class:`SystemRequest`.

    ``generations`` (one per event, or empty) are the responder's generations: a receiver
    that holds an event's parents recomputes and checks it; one that does not (an
    ephemeral node walking history it never held) uses it to order its walk.
    """

    request_id: int = wire(REQUEST_ID)
    events: tuple[Event, ...] = wire(EVENTS)
    generations: tuple[int, ...] = wire(Array(Int(minimum=1), limit="max_batch_events"), default=())

    def check_decoded(self) -> None:
        """Raises DecodeError unless there is one generation per event, or none."""
        if self.generations and len(self.generations) != len(self.events):
            raise DecodeError("an events response needs one generation per event, or none")


@message(24)
class DeltasResponse(Message):
    """Per-entity deltas answering :class:`GetRequest`, :class:`FetchRequest` or
    :class:`SubscribeRequest` (then :class:`SubscriptionUpdate` frames follow)."""

    request_id: int = wire(REQUEST_ID)
    deltas: tuple[Delta, ...] = wire(DELTAS)


@message(30)
class SubscriptionUpdate(Message):
    """Pushed to a subscriber: what changed for one of its standing queries."""

    query_id: int = wire(QUERY_ID)
    deltas: tuple[Delta, ...] = wire(DELTAS)


RESPONSES: Final[Mapping[type[Message], tuple[type[Message], ...]]] = MappingProxyType(
    {
        GetRequest: (DeltasResponse,),
        GetEventsRequest: (EventsResponse,),
        FetchRequest: (DeltasResponse,),
        SubscribeRequest: (DeltasResponse,),
        UnsubscribeRequest: (Ack,),
        CommitRequest: (Ack,),
        SystemRequest: (EventsResponse,),
    }
)
"""Each request type → the response types that answer it when it succeeds. Any request
may instead be answered with :class:`ErrorResponse`; nothing else answers one."""

REQUESTS: Final = tuple(RESPONSES)
"""Every request type, in :data:`RESPONSES` order (what a responder serves)."""

R = TypeVar("R", bound=Message)


def expect_response(response: Message, expected: type[R]) -> R:
    """``response`` as the ``expected`` type (the requester's check of a peer's answer).

    Raises:
        RemoteProtocolError: the peer answered with another message type.
    """
    if not isinstance(response, expected):
        raise RemoteProtocolError(
            f"expected {expected.__name__}, the peer answered {type(response).__name__}"
        )
    return response
