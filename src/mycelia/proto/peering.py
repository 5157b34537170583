"""The peer-to-peer vocabulary: handshake, requests, responses and pushed updates.

Every class here is a registered :class:`~mycelia.proto.messages.Message` whose fields are
declared with their codecs and limits (:mod:`mycelia.proto.schema`): that declaration is
the message's schema, and its encoding and decoding come from it, so a message is spelled
once. Tags are the wire contract (never reuse or renumber one); the golden frames in
``tests/proto`` pin every message's bytes. The session that speaks them, with its
transition table, is :mod:`mycelia.node.session`.

Handshake (ARCHITECTURE.md §7): the first frame each way is a :class:`Presence` carrying
the sender's Ed25519 public key (its node id), durable flag, system root, protocol version
and a fresh random challenge. Then the listener sends its :class:`PresenceProof`; the
dialer verifies it before it sends its own (the payloads are in
:mod:`mycelia.node.identity`), with its credentials token. A version mismatch or a bad
key or proof is answered with :class:`PresenceRejected` and a close.

Requests carry a ``request_id`` chosen by the requester; the answer is exactly one
response with that id: one of the request's response types in :data:`RESPONSES` (the one
table of them: responders dispatch on it, requesters check answers against it with
:func:`expect_response`), or :class:`ErrorResponse` (a stable error code, never a class
name). An answer too large for one frame is **paged**: :data:`PAGES` names the page type
that precedes each response type, and the requester joins the pages with the final
response (:func:`joined`); no frame exceeds the frame limit. Events travel as canonical
bytes and are re-verified on decode; states as :class:`~mycelia.proto.EntityState` wire
arrays. ``docs/protocol.md`` tabulates every message.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, TypeVar

from mycelia.errors import DecodeError, RemoteProtocolError, code_of, error_class
from mycelia.proto.codec import array_header, pack
from mycelia.proto.delta import DELTAS, Delta, encode_deltas
from mycelia.proto.event import Event
from mycelia.proto.ids import EntityId, EventId, NodeId
from mycelia.proto.messages import Message, message
from mycelia.proto.schema import (
    BOOL,
    CLOCK,
    COMMITS,
    ENTITY_ID,
    EVENT_ID,
    EVENTS,
    NAME,
    NODE_ID,
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

__all__ = [
    "CHALLENGE_LENGTH",
    "COMMITTED",
    "PAGES",
    "REQUESTS",
    "RESPONSES",
    "SIGNATURE_LENGTH",
    "Ack",
    "CommitRequest",
    "CommitsRequest",
    "Delta",
    "DeltasPage",
    "DeltasResponse",
    "ErrorResponse",
    "EventsPage",
    "EventsResponse",
    "FetchRequest",
    "GetEventsRequest",
    "GetRequest",
    "KnownEntity",
    "Presence",
    "PresenceProof",
    "PresenceRejected",
    "SubscribeRequest",
    "SubscriptionEnded",
    "SubscriptionUpdate",
    "SystemRequest",
    "UnsubscribeRequest",
    "Verdict",
    "VerdictsResponse",
    "expect_response",
    "joined",
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


@message(17)
class CommitsRequest(Message):
    """Several commits made elsewhere, in the order made (a pipelining requester's, in one
    frame): each is all-or-nothing on the responder, which answers with one
    :class:`VerdictsResponse` holding a verdict per commit, in order."""

    request_id: int = wire(REQUEST_ID)
    commits: tuple[tuple[Event, ...], ...] = wire(COMMITS)


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


ERROR_CODE: Final = Int(minimum=1)
"""A stable error code (:data:`mycelia.errors.CODES`)."""
ERROR_TEXT: Final = 4096


@message(20)
class ErrorResponse(Message):
    """A request failed on the peer: ``code`` is the error's stable code
    (:data:`mycelia.errors.CODES`; the receiver raises :func:`mycelia.errors.remote`)."""

    request_id: int = wire(REQUEST_ID)
    code: int = wire(ERROR_CODE)
    text: str = wire(Str(ERROR_TEXT))

    @classmethod
    def of(cls, request_id: int, error: BaseException) -> ErrorResponse:
        """The answer to request ``request_id`` that failed with ``error``."""
        return cls(request_id, code_of(error), str(error)[:ERROR_TEXT])

    @property
    def kind(self) -> str:
        """The name of the class :attr:`code` names (for logs and metrics)."""
        return error_class(self.code).__name__


@message(21)
class Ack(Message):
    """A request succeeded and has nothing to return."""

    request_id: int = wire(REQUEST_ID)


# Tag 22 (StatesResponse, protocol 1) is retired: GetRequest is answered with deltas.


@record
class Verdict(Record):
    """What became of one commit of a :class:`CommitsRequest`: ``code`` 0 if it was
    committed, else the stable code of the error that refused it (as an
    :class:`ErrorResponse` carries one), with its text."""

    code: int = wire(Int())
    text: str = wire(Str(ERROR_TEXT), default="")

    @classmethod
    def of(cls, error: BaseException | None) -> Verdict:
        """The verdict for a commit that ``error`` refused (``None``: committed)."""
        return COMMITTED if error is None else cls(code_of(error), str(error)[:ERROR_TEXT])


COMMITTED: Final = Verdict(0)
"""The verdict of a commit that was committed."""


@message(27)
class VerdictsResponse(Message):
    """The answer to a :class:`CommitsRequest`: one verdict per commit, in order."""

    request_id: int = wire(REQUEST_ID)
    verdicts: tuple[Verdict, ...] = wire(Array(Nested(Verdict), limit="max_batch_events"))


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

    def to_frame(self) -> bytes:
        """The frame, with the stored states spliced in (:func:`encode_deltas`)."""
        return _deltas_frame(self.TAG, self.request_id, self.deltas)


@message(25)
class DeltasPage(Message):
    """Part of the answer to a request answered by :class:`DeltasResponse`, sent before it
    when the answer does not fit one frame (see :data:`PAGES`)."""

    request_id: int = wire(REQUEST_ID)
    deltas: tuple[Delta, ...] = wire(DELTAS)

    def to_frame(self) -> bytes:
        """The frame, with the stored states spliced in (:func:`encode_deltas`)."""
        return _deltas_frame(self.TAG, self.request_id, self.deltas)


@message(26)
class EventsPage(Message):
    """Part of the answer to a request answered by :class:`EventsResponse`, sent before it
    when the answer does not fit one frame (see :data:`PAGES`)."""

    request_id: int = wire(REQUEST_ID)
    events: tuple[Event, ...] = wire(EVENTS)
    generations: tuple[int, ...] = wire(Array(Int(minimum=1), limit="max_batch_events"), default=())

    def check_decoded(self) -> None:
        """Raises DecodeError unless there is one generation per event, or none."""
        if self.generations and len(self.generations) != len(self.events):
            raise DecodeError("an events page needs one generation per event, or none")


@message(30)
class SubscriptionUpdate(Message):
    """Pushed to a subscriber: what changed for one of its standing queries (a large
    change is split over several updates, each whole for the entities it carries)."""

    query_id: int = wire(QUERY_ID)
    deltas: tuple[Delta, ...] = wire(DELTAS)


@message(31)
class SubscriptionEnded(Message):
    """Pushed to a subscriber: the responder dropped one of its standing queries, for the
    error ``code`` names (its credentials expired, say); no update for it follows."""

    query_id: int = wire(QUERY_ID)
    code: int = wire(ERROR_CODE)
    text: str = wire(Str(ERROR_TEXT))

    @property
    def kind(self) -> str:
        """The name of the class :attr:`code` names."""
        return error_class(self.code).__name__


RESPONSES: Final[Mapping[type[Message], tuple[type[Message], ...]]] = MappingProxyType(
    {
        GetRequest: (DeltasResponse,),
        GetEventsRequest: (EventsResponse,),
        FetchRequest: (DeltasResponse,),
        SubscribeRequest: (DeltasResponse,),
        UnsubscribeRequest: (Ack,),
        CommitRequest: (Ack,),
        CommitsRequest: (VerdictsResponse,),
        SystemRequest: (EventsResponse,),
    }
)
"""Each request type → the response types that answer it when it succeeds. Any request
may instead be answered with :class:`ErrorResponse`; nothing else answers one."""

REQUESTS: Final = tuple(RESPONSES)
"""Every request type, in :data:`RESPONSES` order (what a responder serves)."""

PAGES: Final[Mapping[type[Message], type[Message]]] = MappingProxyType(
    {DeltasResponse: DeltasPage, EventsResponse: EventsPage}
)
"""Each response type that may be paged → the type of its pages. Pages carry the
request's id and come, in order, before the final response, which carries the rest."""


def joined(pages: list[Message], final: Message) -> Message:
    """The whole answer: ``pages`` (of ``final``'s page type, in order) then ``final``.

    Raises:
        RemoteProtocolError: a page is not of ``final``'s page type.
    """
    if not pages:
        return final
    if isinstance(final, DeltasResponse) and all(isinstance(p, DeltasPage) for p in pages):
        deltas = [d for p in pages for d in p.deltas]  # type: ignore[attr-defined]
        return DeltasResponse(final.request_id, (*deltas, *final.deltas))
    if isinstance(final, EventsResponse) and all(isinstance(p, EventsPage) for p in pages):
        parts = [*pages, final]
        events = tuple(e for p in parts for e in p.events)  # type: ignore[attr-defined]
        generations = tuple(g for p in parts for g in p.generations)  # type: ignore[attr-defined]
        if generations and len(generations) != len(events):
            raise RemoteProtocolError("the pages of an events answer disagree on generations")
        return EventsResponse(final.request_id, events, generations)
    raise RemoteProtocolError(f"{type(final).__name__} was preceded by pages of another type")


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


def _deltas_frame(tag: int, request_id: int, deltas: tuple[Delta, ...]) -> bytes:
    """``pack([tag, request_id, DELTAS.encode(deltas)])``, deltas by :func:`encode_deltas`."""
    return array_header(3) + pack(tag) + pack(request_id) + encode_deltas(deltas)
