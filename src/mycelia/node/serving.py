"""The responder: how a node answers its peers' requests and feeds their subscriptions.

Every answer passes the policy agent first (ARCHITECTURE.md §9): reads are filtered by
``can_read`` for the connection's credentials (unreadable entities are simply absent),
commits are checked event by event before anything is durable, and ``_mycelia_``
collections refuse every client write. A remote commit is all-or-nothing.

Subscriptions: a peer's standing query lives here with the heads this node believes the
peer holds. After every local commit the changes go, in order, through one worker per
peer, which pushes a :class:`SubscriptionUpdate` with, per entity, the new events (when
the peer holds the previous head), a bridge or a snapshot, and ``matches=False`` when an
entity leaves the query. Unsubscribing, or disconnecting, stops the pushes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from mycelia.entity import EntityChange, Snapshot
from mycelia.errors import InvalidArgument, LocalProtocolError
from mycelia.node.deltas import delta_for, query_rows
from mycelia.node.policy import Credentials, check_not_reserved
from mycelia.proto import AdmittedEvent, Clock, EntityId, EntityState
from mycelia.proto.messages import Message
from mycelia.proto.peering import (
    Ack,
    CommitRequest,
    Delta,
    DeltasResponse,
    EventsResponse,
    FetchRequest,
    GetEventsRequest,
    GetRequest,
    KnownEntity,
    StatesResponse,
    SubscribeRequest,
    SubscriptionUpdate,
    SystemRequest,
    UnsubscribeRequest,
)
from mycelia.proto.query import Query, evaluate, parse

if TYPE_CHECKING:
    from mycelia.node.node import Node
    from mycelia.node.peer import PeerConnection

__all__ = ["Responder"]

log = logging.getLogger(__name__)

MAX_SUBSCRIPTIONS: Final = 256
"""Standing queries one peer may hold."""


@dataclass(slots=True)
class _Standing:
    query_id: int
    collection: str
    query: Query
    credentials: Credentials
    sent: dict[EntityId, Clock] = field(default_factory=dict)
    """Entities the peer holds for this query, with the head it holds."""


class Responder:
    """Answers requests from peers and pushes their subscriptions' updates."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self._subscriptions: dict[PeerConnection, dict[int, _Standing]] = {}
        self._queues: dict[PeerConnection, asyncio.Queue[list[EntityChange] | None]] = {}
        node.on_change(self._on_change)

    async def handle(self, peer: PeerConnection, msg: Message) -> Message:
        """The response to one request (raise a MyceliaError to answer with an error)."""
        match msg:
            case GetRequest():
                return await self._get(peer, msg)
            case GetEventsRequest():
                return await self._get_events(peer, msg)
            case SystemRequest():
                events = await self._node.system_events()
                return EventsResponse(msg.request_id, tuple(e.event for e in events))
            case CommitRequest():
                return await self._commit(peer, msg)
            case FetchRequest():
                query = _bound(msg.query, msg.args)
                deltas, _ = await self._deltas(peer.credentials, msg.collection, query, msg.known)
                return DeltasResponse(msg.request_id, deltas)
            case SubscribeRequest():
                return await self._subscribe(peer, msg)
            case UnsubscribeRequest():
                self._subscriptions.get(peer, {}).pop(msg.query_id, None)
                return Ack(msg.request_id)
        raise LocalProtocolError(f"{type(msg).__name__} is not a request")

    def subscription_count(self) -> int:
        """Standing queries held for all peers."""
        return sum(len(s) for s in self._subscriptions.values())

    def forget(self, peer: PeerConnection) -> None:
        """Drop everything held for a closed connection."""
        self._subscriptions.pop(peer, None)
        queue = self._queues.pop(peer, None)
        if queue is not None:
            queue.put_nowait(None)

    # -- requests --------------------------------------------------------------------------

    async def _get(self, peer: PeerConnection, msg: GetRequest) -> StatesResponse:
        states = await self._node.storage.get_states(msg.entity_ids)
        readable = []
        for state in states.values():
            entity = await self._node.applier.load(state.entity_id)
            if entity is not None and self._node.policy.can_read(
                peer.credentials, entity.snapshot()
            ):
                readable.append(entity.to_state())
        return StatesResponse(msg.request_id, tuple(readable))

    async def _get_events(self, peer: PeerConnection, msg: GetEventsRequest) -> EventsResponse:
        found = await self._node.storage.get_events(msg.event_ids, ahead=msg.ahead)
        readable: dict[EntityId, bool] = {}
        events = []
        for event in found.values():
            if event.entity_id not in readable:
                entity = await self._node.applier.load(event.entity_id)
                readable[event.entity_id] = entity is not None and self._node.policy.can_read(
                    peer.credentials, entity.snapshot()
                )
            if readable[event.entity_id]:
                events.append(event)
        events.sort(key=lambda e: (e.generation, e.id))
        return EventsResponse(msg.request_id, tuple(e.event for e in events))

    async def _commit(self, peer: PeerConnection, msg: CommitRequest) -> Ack:
        for event in msg.events:
            check_not_reserved(event.collection)
        policy, credentials = self._node.policy, peer.credentials

        def check(before: Snapshot, after: Snapshot, event: AdmittedEvent) -> None:
            policy.check_event(credentials, before, after, event)

        await self._node.commit_remote(list(msg.events), check=check)
        return Ack(msg.request_id)

    async def _subscribe(self, peer: PeerConnection, msg: SubscribeRequest) -> DeltasResponse:
        query = _bound(msg.query, msg.args)
        standing = self._subscriptions.setdefault(peer, {})
        if msg.query_id not in standing and len(standing) >= MAX_SUBSCRIPTIONS:
            raise InvalidArgument(f"a peer may hold at most {MAX_SUBSCRIPTIONS} subscriptions")
        deltas, members = await self._deltas(peer.credentials, msg.collection, query, msg.known)
        standing[msg.query_id] = _Standing(
            msg.query_id, msg.collection, query, peer.credentials, members
        )
        self._ensure_worker(peer)
        return DeltasResponse(msg.request_id, deltas)

    async def _deltas(
        self,
        credentials: Credentials,
        collection: str,
        query: Query,
        known: tuple[KnownEntity, ...],
    ) -> tuple[tuple[Delta, ...], dict[EntityId, Clock]]:
        """Deltas for a query's matches, plus removals for known entities that left it."""
        known_heads = {k.entity_id: k.head for k in known}
        deltas: list[Delta] = []
        members: dict[EntityId, Clock] = {}
        for stored in await query_rows(self._node.storage, collection, query):
            state = stored.state
            snapshot = _snapshot(stored.state, stored.values)
            if not self._node.policy.can_read(credentials, snapshot):
                continue
            delta = await delta_for(
                self._node.storage, state, known_heads.pop(state.entity_id, None)
            )
            if delta is not None:
                deltas.append(delta)
            members[state.entity_id] = state.state.head
        for entity_id, head in known_heads.items():  # known to the peer, no longer matching
            current = await self._node.storage.get_state(entity_id)
            if current is None or current.collection != collection:
                continue
            gone = await delta_for(self._node.storage, current, head, matches=False)
            deltas.append(gone or Delta(entity_id, collection, False, None, ()))
        return tuple(deltas), members

    # -- pushing updates ---------------------------------------------------------------------

    def _on_change(self, changes: list[EntityChange]) -> None:
        for peer, queue in self._queues.items():
            if self._subscriptions.get(peer):
                try:
                    queue.put_nowait(changes)
                except asyncio.QueueFull:
                    log.warning(
                        "subscriber %s is too slow: disconnecting it", peer.transport.remote
                    )
                    peer.spawn(peer.close())

    def _ensure_worker(self, peer: PeerConnection) -> None:
        if peer in self._queues:
            return
        queue: asyncio.Queue[list[EntityChange] | None] = asyncio.Queue(1024)
        self._queues[peer] = queue
        peer.spawn(self._feed(peer, queue))

    async def _feed(
        self, peer: PeerConnection, queue: asyncio.Queue[list[EntityChange] | None]
    ) -> None:
        while (changes := await queue.get()) is not None:
            for standing in list(self._subscriptions.get(peer, {}).values()):
                deltas = await self._update(standing, changes)
                if deltas and standing.query_id in self._subscriptions.get(peer, {}):
                    peer.push(SubscriptionUpdate(standing.query_id, tuple(deltas)))

    async def _update(self, standing: _Standing, changes: list[EntityChange]) -> list[Delta]:
        relevant = [c for c in changes if c.after.collection == standing.collection]
        if not relevant:
            return []
        if standing.query.limit is not None:
            return await self._refresh(standing, relevant)
        deltas = []
        for change in relevant:
            member = self._member(standing, change.after)
            delta = await self._delta_for_change(standing, change, member=member)
            if delta is not None:
                deltas.append(delta)
        return deltas

    async def _refresh(self, standing: _Standing, changes: list[EntityChange]) -> list[Delta]:
        """LIMIT queries: membership depends on other rows, so recompute the result."""
        rows = await query_rows(self._node.storage, standing.collection, standing.query)
        now = {
            s.state.entity_id
            for s in rows
            if self._node.policy.can_read(standing.credentials, _snapshot(s.state, s.values))
        }
        deltas = []
        for change in changes:
            delta = await self._delta_for_change(
                standing, change, member=change.after.entity_id in now
            )
            if delta is not None:
                deltas.append(delta)
        for stored in rows:  # refills: rows that entered because others left
            entity_id = stored.state.entity_id
            if entity_id in now and entity_id not in standing.sent:
                delta = await delta_for(self._node.storage, stored.state, None)
                if delta is not None:
                    deltas.append(delta)
                    standing.sent[entity_id] = stored.state.state.head
        for entity_id in [e for e in standing.sent if e not in now]:
            deltas.append(Delta(entity_id, standing.collection, False, None, ()))
            del standing.sent[entity_id]
        return deltas

    async def _delta_for_change(
        self, standing: _Standing, change: EntityChange, *, member: bool
    ) -> Delta | None:
        entity_id = change.after.entity_id
        held = standing.sent.get(entity_id)
        if not member and held is None:
            return None
        delta: Delta | None
        if held is not None and held == change.before.head:
            events = tuple(e.event for e in change.events)
            delta = Delta(entity_id, standing.collection, member, None, events)
        else:
            state = await self._node.storage.get_state(entity_id)
            if state is None:
                return None
            delta = await delta_for(self._node.storage, state, held, matches=member)
        if member:
            standing.sent[entity_id] = change.after.head
        else:
            standing.sent.pop(entity_id, None)
        return delta

    def _member(self, standing: _Standing, snapshot: Snapshot) -> bool:
        return evaluate(standing.query.predicate, snapshot.values) and self._node.policy.can_read(
            standing.credentials, snapshot
        )


def _bound(text: str, args: tuple[object, ...]) -> Query:
    """The peer's query, parsed and bound (QueryError / InvalidArgument answer the peer)."""
    return parse(text).bind(*args)


def _snapshot(state: EntityState, values: Mapping[str, object]) -> Snapshot:
    return Snapshot(state.entity_id, state.collection, state.state.head, values)
