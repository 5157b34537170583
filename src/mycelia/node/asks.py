"""The requests a node's upstream makes of its durable peer, and how it reads a deltas
answer (:mod:`mycelia.node.upstream`)."""

from __future__ import annotations

from collections.abc import Sequence

from mycelia.node.ports import MakeRequest
from mycelia.proto import EventId
from mycelia.proto.messages import Message
from mycelia.proto.peering import (
    Delta,
    DeltasPage,
    DeltasResponse,
    GetEventsRequest,
    GetRequest,
    KnownEntity,
    expect_response,
)

__all__ = ["ask_events", "ask_get", "deltas_of"]


def deltas_of(part: Message) -> tuple[Delta, ...]:
    """The deltas of one page, or of the final response, of a deltas answer
    (RemoteProtocolError for anything else)."""
    if isinstance(part, DeltasPage):
        return part.deltas
    return expect_response(part, DeltasResponse).deltas


def ask_events(ids: tuple[EventId, ...]) -> MakeRequest:
    """Events by id, with up to 256 of their ancestors (filling gaps)."""
    return lambda rid: GetEventsRequest(rid, ids, 256)


def ask_get(known: Sequence[KnownEntity]) -> MakeRequest:
    """The states of the entities ``known`` names, given the heads held here."""
    named, ids = tuple(known), tuple(k.entity_id for k in known)
    return lambda rid: GetRequest(rid, ids, named)
