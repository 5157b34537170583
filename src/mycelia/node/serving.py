"""The responder: how a node answers its peers' requests and feeds their subscriptions.

Every answer passes the policy agent first (ARCHITECTURE.md §9): reads are filtered by
``can_read`` for the connection's credentials (unreadable entities are simply absent),
commits are checked event by event before anything is durable, and ``_mycelia_``
collections refuse every client write. A remote commit is all-or-nothing.

Commits: a connection's commits arrive here in order, several at once when the peer
pipelines them (:meth:`Responder.commit`). Each is admitted and checked on its own, in
that order, and together they take one storage write and one round of pushes to
subscribers; when one is refused they are applied one by one instead, so each gets its own
verdict and one refusal takes nothing else with it (a later commit built on a refused one
is refused too: its parent is unknown).

Subscriptions: a peer's standing query lives here with the heads this node believes the
peer holds. After every local commit the changes go, in order, through one worker per
peer, which pushes a :class:`SubscriptionUpdate` with, per entity, the new events (when
the peer holds the previous head), a bridge or a snapshot, and ``matches=False`` when an
entity leaves the query. Unsubscribing, or disconnecting, stops the pushes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from mycelia.entity import Entity, EntityChange, EventCheck, IngestResult, Snapshot
from mycelia.errors import InvalidArgument, LocalProtocolError, MyceliaError
from mycelia.node.deltas import delta_for, query_rows
from mycelia.node.policy import Credentials, PolicyAgent, check_not_reserved
from mycelia.node.ports import Peer
from mycelia.proto import AdmittedEvent, Clock, EntityId, EntityState, Event
from mycelia.proto.messages import Message
from mycelia.proto.peering import (
    Ack,
    CommitRequest,
    Delta,
    DeltasResponse,
    ErrorResponse,
    EventsResponse,
    FetchRequest,
    GetEventsRequest,
    GetRequest,
    KnownEntity,
    SubscribeRequest,
    SubscriptionUpdate,
    SystemRequest,
    UnsubscribeRequest,
)
from mycelia.proto.query import Query, evaluate, parse
from mycelia.proto.query.compile import Compiled, compile_predicate
from mycelia.storage import StorageEngine

__all__ = ["Loader", "Responder"]

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
    predicate: Compiled | None = None
    """The query's predicate, compiled once (see :mod:`mycelia.proto.query.compile`)."""
    """Entities the peer holds for this query, with the head it holds."""


class Loader(Protocol):
    """How the responder reads an entity as this node holds it (the applier)."""

    async def load(self, entity_id: EntityId) -> Entity | None:
        """The entity (``None`` if unknown)."""
        ...


CommitRemote = Callable[[list[list[Event]], EventCheck], Awaitable[IngestResult]]
"""Commits a peer's commits, in order, each all-or-nothing and checked first, in one
write; raises the first refusal, writing nothing (and tells the listeners)."""


class Responder:
    """Answers requests from peers and pushes their subscriptions' updates.

    Wire :meth:`on_change` as a change listener of the node.
    """

    def __init__(
        self,
        entities: Loader,
        storage: StorageEngine,
        *,
        policy: PolicyAgent,
        commit: CommitRemote,
        system_events: Callable[[], Awaitable[list[AdmittedEvent]]],
    ) -> None:
        self._entities = entities
        self._storage = storage
        self._policy = policy
        self._commit_remote = commit
        self._system_events = system_events
        self._subscriptions: dict[Peer, dict[int, _Standing]] = {}
        self._queues: dict[Peer, asyncio.Queue[list[EntityChange] | None]] = {}

    async def handle(self, peer: Peer, msg: Message) -> Message:
        """The response to one request (raise a MyceliaError to answer with an error)."""
        match msg:
            case GetRequest():
                return await self._get(peer, msg)
            case GetEventsRequest():
                return await self._get_events(peer, msg)
            case SystemRequest():
                events = await self._system_events()
                return EventsResponse(msg.request_id, tuple(e.event for e in events))
            case CommitRequest():
                (response,) = await self.commit(peer, [msg])
                return response
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

    def forget(self, peer: Peer) -> None:
        """Drop everything held for a closed connection."""
        self._subscriptions.pop(peer, None)
        queue = self._queues.pop(peer, None)
        if queue is not None:
            queue.put_nowait(None)

    # -- requests --------------------------------------------------------------------------

    async def _get(self, peer: Peer, msg: GetRequest) -> DeltasResponse:
        known = {k.entity_id: k.head for k in msg.known}
        deltas = []
        for entity_id in msg.entity_ids:
            entity = await self._entities.load(entity_id)
            if entity is None or not entity.exists:
                continue
            if not self._policy.can_read(peer.credentials, entity.snapshot()):
                continue
            delta = await delta_for(self._storage, entity.to_state(), known.get(entity_id))
            if delta is not None:
                deltas.append(delta)
        return DeltasResponse(msg.request_id, tuple(deltas))

    async def _get_events(self, peer: Peer, msg: GetEventsRequest) -> EventsResponse:
        found = await self._storage.get_events(msg.event_ids, ahead=msg.ahead)
        readable: dict[EntityId, bool] = {}
        events = []
        for event in found.values():
            if event.entity_id not in readable:
                entity = await self._entities.load(event.entity_id)
                readable[event.entity_id] = entity is not None and self._policy.can_read(
                    peer.credentials, entity.snapshot()
                )
            if readable[event.entity_id]:
                events.append(event)
        events.sort(key=lambda e: (e.generation, e.id))
        return EventsResponse(
            msg.request_id, tuple(e.event for e in events), tuple(e.generation for e in events)
        )

    async def commit(self, peer: Peer, requests: Sequence[CommitRequest]) -> list[Message]:
        """Apply a connection's commits in order: together if they all pass, else one by
        one (see the module docstring); one response per request, in order."""
        check = self._check(peer.credentials)
        if len(requests) > 1:
            try:
                for request in requests:
                    for event in request.events:
                        check_not_reserved(event.collection)
                await self._commit_remote([list(r.events) for r in requests], check)
            except MyceliaError:
                pass  # one of them is refused: find which, one by one
            else:
                return [Ack(r.request_id) for r in requests]
        return [await self._commit_one(r, check) for r in requests]

    async def _commit_one(self, request: CommitRequest, check: EventCheck) -> Message:
        try:
            for event in request.events:
                check_not_reserved(event.collection)
            await self._commit_remote([list(request.events)], check)
        except MyceliaError as exc:
            return ErrorResponse(request.request_id, type(exc).__name__, str(exc)[:4000])
        return Ack(request.request_id)

    def _check(self, credentials: Credentials) -> EventCheck:
        policy = self._policy

        def check(before: Snapshot, after: Snapshot, event: AdmittedEvent) -> None:
            policy.check_event(credentials, before, after, event)

        return check

    async def _subscribe(self, peer: Peer, msg: SubscribeRequest) -> DeltasResponse:
        query = _bound(msg.query, msg.args)
        standing = self._subscriptions.setdefault(peer, {})
        if msg.query_id not in standing and len(standing) >= MAX_SUBSCRIPTIONS:
            raise InvalidArgument(f"a peer may hold at most {MAX_SUBSCRIPTIONS} subscriptions")
        deltas, members = await self._deltas(peer.credentials, msg.collection, query, msg.known)
        standing[msg.query_id] = _Standing(
            msg.query_id,
            msg.collection,
            query,
            peer.credentials,
            members,
            compile_predicate(query.predicate),
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
        """Deltas for a query's result, plus what the peer must know about what it holds.

        Returns the deltas and the entities the peer then holds fresh for this query: the
        result, plus known entities that still match the predicate (outside a LIMIT they
        are kept fresh, so the peer's own ordering stays right).
        """
        known_heads = {k.entity_id: k.head for k in known}
        deltas: list[Delta] = []
        members: dict[EntityId, Clock] = {}
        for stored in await query_rows(self._storage, collection, query):
            state = stored.state
            if not self._policy.can_read(credentials, _snapshot(state, stored.values)):
                continue
            held = known_heads.pop(state.entity_id, None)
            delta = await delta_for(self._storage, state, held)
            if delta is not None:
                deltas.append(delta)
            members[state.entity_id] = state.state.head
        for entity_id, head in known_heads.items():
            entity = await self._entities.load(entity_id)
            if entity is None or not entity.exists or entity.collection != collection:
                continue
            snapshot = entity.snapshot()
            readable = self._policy.can_read(credentials, snapshot)
            matches = (
                readable and not snapshot.deleted and evaluate(query.predicate, snapshot.values)
            )
            if readable or matches:
                delta = await delta_for(self._storage, entity.to_state(), head, matches=matches)
            else:
                delta = Delta(entity_id, collection, False, None, ())
            if delta is not None:
                deltas.append(delta)
            if matches:
                members[entity_id] = snapshot.head
        return tuple(deltas), members

    # -- pushing updates ---------------------------------------------------------------------

    def on_change(self, changes: list[EntityChange]) -> None:
        """Queue ``changes`` for every subscribed peer (a change listener of the node)."""
        for peer, queue in self._queues.items():
            if self._subscriptions.get(peer):
                try:
                    queue.put_nowait(changes)
                except asyncio.QueueFull:
                    log.warning("subscriber %s is too slow: disconnecting it", peer.remote)
                    peer.spawn(peer.close())

    def _ensure_worker(self, peer: Peer) -> None:
        if peer in self._queues:
            return
        queue: asyncio.Queue[list[EntityChange] | None] = asyncio.Queue(1024)
        self._queues[peer] = queue
        peer.spawn(self._feed(peer, queue))

    async def _feed(self, peer: Peer, queue: asyncio.Queue[list[EntityChange] | None]) -> None:
        while (changes := await queue.get()) is not None:
            for standing in list(self._subscriptions.get(peer, {}).values()):
                deltas = await self._update(standing, changes)
                if deltas and standing.query_id in self._subscriptions.get(peer, {}):
                    peer.push(SubscriptionUpdate(standing.query_id, tuple(deltas)))

    async def _update(self, standing: _Standing, changes: list[EntityChange]) -> list[Delta]:
        """The deltas a batch of changes means for one standing query.

        The peer holds ``standing.sent`` fresh while they match the predicate; a new match
        is pushed if it belongs to the result (with a LIMIT, only if it ranks inside it:
        then members that left the LIMIT stay fresh on the peer, and rows that entered to
        refill it are pushed).
        """
        relevant = [c for c in changes if c.after.collection == standing.collection]
        if not relevant:
            return []
        limited = standing.query.limit is not None
        ranked: set[EntityId] | None = await self._ranked(standing) if limited else None
        deltas = []
        for change in relevant:
            entity_id = change.after.entity_id
            member = self._member(standing, change.after)
            if entity_id not in standing.sent and ranked is not None and entity_id not in ranked:
                member = False  # a match outside the LIMIT: nothing the peer needs yet
            delta = await self._delta_for_change(standing, change, member=member)
            if delta is not None:
                deltas.append(delta)
        if ranked is not None:
            deltas.extend(await self._refill(standing, ranked))
        return deltas

    async def _ranked(self, standing: _Standing) -> set[EntityId]:
        rows = await query_rows(self._storage, standing.collection, standing.query)
        return {
            s.state.entity_id
            for s in rows
            if self._policy.can_read(standing.credentials, _snapshot(s.state, s.values))
        }

    async def _refill(self, standing: _Standing, ranked: set[EntityId]) -> list[Delta]:
        """Rows that entered a LIMIT result because others left it."""
        deltas = []
        for entity_id in ranked - set(standing.sent):
            state = await self._storage.get_state(entity_id)
            if state is None:
                continue
            delta = await delta_for(self._storage, state, None)
            if delta is not None:
                deltas.append(delta)
            standing.sent[entity_id] = state.state.head
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
            state = await self._storage.get_state(entity_id)
            if state is None:
                return None
            delta = await delta_for(self._storage, state, held, matches=member)
        if member:
            standing.sent[entity_id] = change.after.head
        else:
            standing.sent.pop(entity_id, None)
        return delta

    def _member(self, standing: _Standing, snapshot: Snapshot) -> bool:
        return (
            not snapshot.deleted
            and (standing.predicate or compile_predicate(standing.query.predicate))(snapshot.values)
            and self._policy.can_read(standing.credentials, snapshot)
        )


def _bound(text: str, args: tuple[object, ...]) -> Query:
    """The peer's query, parsed and bound (QueryError / InvalidArgument answer the peer)."""
    return parse(text).bind(*args)


def _snapshot(state: EntityState, values: Mapping[str, object]) -> Snapshot:
    return Snapshot(state.entity_id, state.collection, state.state.head, values)
