"""The responder: how a node answers its peers' requests and feeds their subscriptions.

Every answer passes the policy agent first (ARCHITECTURE.md §9): reads are filtered by
``can_read`` for the connection's credentials (unreadable entities are simply absent, and
an entity the requester names as held but may not read, or that is in another
collection, is answered exactly like one that does not exist: no existence oracle),
commits are checked event by event before anything is durable, and ``_mycelia_``
collections refuse every client write. A remote commit is all-or-nothing.

Answers are paged (ARCHITECTURE.md §7): a Get, Fetch, Subscribe or GetEvents answer is
cut into pages of about the peer's ``page_bytes`` (an entity's snapshot always fits one
page: an entity is never let grow past ``limits.max_entity_bytes``), each sent once the
peer's outgoing budget has room for it, the last as the response itself. Queries run
within the cost budget (:func:`mycelia.node.deltas.served_rows`).

Commits: a connection's commits arrive here in order, several at once when the peer
pipelines them (:meth:`Responder.commit`). Each is admitted and checked on its own, in
that order, and together they take one storage write and one round of pushes to
subscribers; when one is refused they are applied one by one instead, so each gets its own
verdict and one refusal takes nothing else with it (a later commit built on a refused one
is refused too: its parent is unknown).

Subscriptions: a peer's standing query lives here with the heads this node believes the
peer holds; what its answer and each update send is computed by
:mod:`mycelia.node.served`. After every local commit the changes go, in order, through
one worker per peer (its queue bounded in bytes, :mod:`mycelia.node.pushes`: a peer that
falls behind is cut off), which pushes :class:`SubscriptionUpdate` frames (what was
queued while the previous push was built goes in one) with, per entity, the new events
(when the peer holds the previous head and may still read it), a bridge or a snapshot,
and ``matches=False`` (with no data) when an entity leaves the query or may no longer be
read. Before each push the peer's credentials are checked again: once they no longer
admit it (an expired token), each of its standing queries ends with a
:class:`SubscriptionEnded` carrying the error's code, and nothing more is pushed.
Unsubscribing, or disconnecting, stops the pushes. A peer is not sent back its own
commit: a change made only of events the peer committed, on the head this node believes
it holds, pushes nothing to it (the head after it is noted as held); the other
subscribers get it. One merged here with events the peer may lack is pushed to it even
where its query holds nothing (mycelia.node.served).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Final

from mycelia.entity import EntityChange, EventCheck, IngestResult, Snapshot
from mycelia.errors import (
    ConnectionClosed,
    InvalidArgument,
    LocalProtocolError,
    MyceliaError,
    PolicyDenied,
    PresenceRejected,
    code_of,
)
from mycelia.node.budget import ANSWER_PAGE_BYTES, FIRST_PAGE_BYTES
from mycelia.node.deltas import check_cost, delta_for
from mycelia.node.peer_parts import answer_size
from mycelia.node.policy import Credentials, PolicyAgent, check_not_reserved
from mycelia.node.ports import Peer
from mycelia.node.pushes import FEED_BYTES, Missed, SubscriberFeed, changes_size
from mycelia.node.served import Loader, Own, ServedQueries, ServedQuery
from mycelia.proto import AdmittedEvent, Clock, EntityId, Event, EventId
from mycelia.proto.limits import MAX_BATCH_EVENTS
from mycelia.proto.messages import Message
from mycelia.proto.peering import (
    Ack,
    CommitRequest,
    CommitsRequest,
    Delta,
    DeltasPage,
    DeltasResponse,
    ErrorResponse,
    EventsPage,
    EventsResponse,
    FetchRequest,
    GetEventsRequest,
    GetRequest,
    SubscribeRequest,
    SubscriptionEnded,
    SubscriptionUpdate,
    SystemRequest,
    UnsubscribeRequest,
    Verdict,
    VerdictsResponse,
)
from mycelia.proto.query import Query, parse
from mycelia.proto.query.compile import compile_predicate
from mycelia.storage import StorageEngine

__all__ = ["Responder"]

log = logging.getLogger(__name__)

MAX_SUBSCRIPTIONS: Final = 256
"""Standing queries one peer may hold."""
PAGE_ENVELOPE: Final = 1024
"""Room a page keeps for its message around its deltas or events."""

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
        self._served = ServedQueries(entities, storage, policy)
        self._subscriptions: dict[Peer, dict[int, ServedQuery]] = {}
        self._queues: dict[Peer, SubscriberFeed] = {}
        self._lanes: dict[Peer, asyncio.Lock] = {}
        """Each peer's lane for heavy queries (one at a time per connection)."""
        self._authored: dict[Peer, set[EventId]] = {}
        """The events of each peer's commits being written now (see :meth:`on_change`)."""
        self._own: dict[Peer, dict[tuple[EntityId, Clock], Own]] = {}
        """Changes (entity, head after) holding the peer's own events, not pushed yet."""
        self._answering: set[Missed] = set()
        """Per subscription being answered, the changes committed meanwhile (see
        :meth:`_subscribe`)."""

    async def handle(self, peer: Peer, msg: Message) -> Message | None:
        """The response to one request (raise a MyceliaError to answer with an error;
        ``None`` for a subscription, whose response :meth:`_subscribe` sends itself)."""
        match msg:
            case GetRequest():
                return await _paged_deltas(peer, msg.request_id, self._get(peer, msg))
            case GetEventsRequest():
                return await self._get_events(peer, msg)
            case SystemRequest():
                events = await self._system_events()
                return await _paged_events(peer, msg.request_id, events, generations=False)
            case CommitRequest() | CommitsRequest():
                (response,) = await self.commit(peer, [msg])
                return response
            case FetchRequest():
                query = _bound(msg.query, msg.args)
                answer = ServedQuery(0, msg.collection, query, peer.credentials)
                deltas = self._served.answer(answer, msg.known, lane=self._lane(peer))
                return await _paged_deltas(peer, msg.request_id, deltas)
            case SubscribeRequest():
                await self._subscribe(peer, msg)  # (it sends its response)
                return None
            case UnsubscribeRequest():
                self._subscriptions.get(peer, {}).pop(msg.query_id, None)
                return Ack(msg.request_id)
        raise LocalProtocolError(f"{type(msg).__name__} is not a request")

    def subscription_count(self) -> int:
        """Standing queries held for all peers."""
        return sum(len(s) for s in self._subscriptions.values())

    def collections(self) -> set[str]:
        """The collections the subscriptions served (and being answered) read now."""
        shown = {m.collection for m in self._answering}
        for standing in self._subscriptions.values():
            shown.update(s.collection for s in standing.values())
        return shown

    def forget(self, peer: Peer) -> None:
        """Drop everything held for a closed connection."""
        self._subscriptions.pop(peer, None)
        self._lanes.pop(peer, None)
        self._own.pop(peer, None)
        feed = self._queues.pop(peer, None)
        if feed is not None:
            feed.close()

    def _lane(self, peer: Peer) -> asyncio.Lock:
        lane = self._lanes.get(peer)
        if lane is None:
            lane = self._lanes[peer] = asyncio.Lock()
        return lane

    # -- requests --------------------------------------------------------------------------

    async def _get(self, peer: Peer, msg: GetRequest) -> AsyncIterator[Delta]:
        known = {k.entity_id: k.head for k in msg.known}
        for entity_id in msg.entity_ids:
            entity = await self._entities.settled(entity_id)
            if entity is None or not entity.exists:
                continue
            if not self._policy.can_read(peer.credentials, entity.snapshot()):
                continue
            delta = await delta_for(self._storage, entity.to_state(), known.get(entity_id))
            if delta is not None:
                yield delta

    async def _get_events(self, peer: Peer, msg: GetEventsRequest) -> Message:
        found = await self._storage.get_events(msg.event_ids, ahead=msg.ahead)
        readable: dict[EntityId, bool] = {}
        events = []
        for event in found.values():
            if event.entity_id not in readable:
                entity = await self._entities.settled(event.entity_id)
                readable[event.entity_id] = entity is not None and self._policy.can_read(
                    peer.credentials, entity.snapshot()
                )
            if readable[event.entity_id]:
                events.append(event)
        events.sort(key=lambda e: (e.generation, e.id))
        return await _paged_events(peer, msg.request_id, events, generations=True)

    async def commit(
        self, peer: Peer, requests: Sequence[CommitRequest | CommitsRequest]
    ) -> list[Message]:
        """Apply a connection's commits in order: together if they all pass, else one by
        one (see the module docstring); one response per request, in order (an Ack or an
        ErrorResponse for a CommitRequest, a VerdictsResponse for a CommitsRequest)."""
        commits = [c for r in requests for c in _commits_of(r)]
        verdicts = iter(await self._verdicts(peer, commits))
        responses: list[Message] = []
        for request in requests:
            if isinstance(request, CommitsRequest):
                mine = tuple(Verdict.of(next(verdicts)) for _ in request.commits)
                responses.append(VerdictsResponse(request.request_id, mine))
            elif (error := next(verdicts)) is None:
                responses.append(Ack(request.request_id))
            else:
                responses.append(ErrorResponse.of(request.request_id, error))
        return responses

    async def _verdicts(
        self, peer: Peer, commits: Sequence[tuple[Event, ...]]
    ) -> list[MyceliaError | None]:
        """Each commit's refusal (``None``: committed), applied as :meth:`commit` says."""
        check = self._check(peer.credentials)
        authored = self._authored[peer] = {e.id for c in commits for e in c}
        try:
            if len(commits) > 1:
                try:
                    for commit in commits:
                        for event in commit:
                            check_not_reserved(event.collection)
                    await self._commit_remote([list(c) for c in commits], check)
                except MyceliaError as exc:  # one of them is refused: find which, one by one
                    log.debug(
                        "%d commits from %s: one refused (%r)", len(commits), peer.remote, exc
                    )
                else:
                    return [None] * len(commits)
            return [await self._commit_one(c, check) for c in commits]
        finally:
            if self._authored.get(peer) is authored:
                del self._authored[peer]

    async def _commit_one(
        self, commit: tuple[Event, ...], check: EventCheck
    ) -> MyceliaError | None:
        try:
            for event in commit:
                check_not_reserved(event.collection)
            await self._commit_remote([list(commit)], check)
        except MyceliaError as exc:
            return exc
        return None

    def _check(self, credentials: Credentials) -> EventCheck:
        policy = self._policy

        def check(before: Snapshot, after: Snapshot, event: AdmittedEvent) -> None:
            policy.check_event(credentials, before, after, event)

        return check

    async def _subscribe(self, peer: Peer, msg: SubscribeRequest) -> None:
        query = _bound(msg.query, msg.args)
        standing = self._subscriptions.setdefault(peer, {})
        if msg.query_id not in standing and len(standing) >= MAX_SUBSCRIPTIONS:
            raise InvalidArgument(f"a peer may hold at most {MAX_SUBSCRIPTIONS} subscriptions")
        fresh = ServedQuery(
            msg.query_id,
            msg.collection,
            query,
            peer.credentials,
            predicate=compile_predicate(query.predicate),
        )
        # The answer reads the entities one by one while commits go on, and the query
        # stands only once it is built: what is committed meanwhile is kept and fed to
        # the peer's subscriptions then (each is compared with what was sent, so what the
        # answer already held costs nothing). Before, an entity read just before such a
        # commit stayed behind on the peer until its next change.
        # The response is sent before the subscription stands: the peer reads every update
        # of it after the response, and one before it as the subscription's it replaces
        # (mycelia.node.kept).
        missed = Missed(msg.collection)
        self._answering.add(missed)
        try:
            deltas = self._served.answer(fresh, msg.known, lane=self._lane(peer))
            response = await _paged_deltas(peer, msg.request_id, deltas)
            await peer.send(response, size=answer_size(response))
        finally:
            self._answering.discard(missed)
        if peer.closed:  # forget(peer) has run or will: what is kept now would leak with it
            raise ConnectionClosed("the connection closed while the subscription was answered")
        standing[msg.query_id] = fresh
        self._ensure_worker(peer)
        feed = self._queues[peer]
        if missed.overflowed or not all(feed.offer(c, n) for c, n in missed.changes):
            peer.cut_off(f"its subscriptions fell more than {FEED_BYTES} bytes behind")

    # -- pushing updates ---------------------------------------------------------------------

    def on_change(self, changes: list[EntityChange]) -> None:
        """Queue ``changes`` for every subscribed peer (a change listener of the node),
        noting which of them are that peer's own commit (its feed consumes the note)."""
        if not (self._answering or self._queues):
            return  # nobody subscribes here (a client, mostly): nothing to size or queue
        size = changes_size(changes)
        for missed in self._answering:
            missed.add(changes, size)
        for peer, feed in self._queues.items():
            if not self._subscriptions.get(peer):
                continue
            authored = self._authored.get(peer)
            if authored:
                _note_own(self._own.setdefault(peer, {}), changes, authored)
            if not feed.offer(changes, size):
                peer.cut_off(f"its subscriptions fell more than {FEED_BYTES} bytes behind")

    def _ensure_worker(self, peer: Peer) -> None:
        if peer in self._queues:
            return
        feed = self._queues[peer] = SubscriberFeed(FEED_BYTES)
        peer.spawn(self._feed(peer, feed))

    async def _feed(self, peer: Peer, feed: SubscriberFeed) -> None:
        while (changes := await feed.get()) is not None:
            if not self._still_admitted(peer):
                return
            noted = self._own.get(peer, {})
            own = {id(c): o for c in changes if (o := noted.get(_key(c))) is not None}
            for standing in list(self._subscriptions.get(peer, {}).values()):
                lane = self._lane(peer)
                deltas = await self._served.update(standing, changes, own, lane=lane)
                for chunk in _pages(deltas, peer.page_bytes):
                    if standing.query_id not in self._subscriptions.get(peer, {}):
                        break
                    peer.push(SubscriptionUpdate(standing.query_id, tuple(chunk)))
            for change in changes:
                noted.pop(_key(change), None)

    def _still_admitted(self, peer: Peer) -> bool:
        """Whether the peer's credentials still admit it (checked before every push); if
        not, end each of its standing queries with the error, and push nothing more."""
        try:
            peer.check_credentials()
        except (PolicyDenied, PresenceRejected) as exc:
            ended = self._subscriptions.pop(peer, {})
            log.info("ending %d subscriptions of %s: %s", len(ended), peer.remote, exc)
            text = str(exc)[:4000]
            for query_id in ended:
                peer.push(SubscriptionEnded(query_id, code_of(exc), text))
            return False
        return True


def _note_own(
    own: dict[tuple[EntityId, Clock], Own], changes: Sequence[EntityChange], authored: set[EventId]
) -> None:
    """Note the changes holding events of a peer's commits (``authored``): an echo is made
    only of them; a change whose head holds another event is one the peer may lack."""
    for change in changes:
        mine = [e.id in authored for e in change.events]
        if any(mine):
            behind = any(i not in authored for i in change.after.head.ids)
            own[_key(change)] = Own(echo=all(mine), behind=behind)


def _key(change: EntityChange) -> tuple[EntityId, Clock]:
    return change.after.entity_id, change.after.head


def _commits_of(request: CommitRequest | CommitsRequest) -> tuple[tuple[Event, ...], ...]:
    return request.commits if isinstance(request, CommitsRequest) else (request.events,)


def _bound(text: str, args: tuple[object, ...]) -> Query:
    """The peer's query, parsed, bound and within the cost budget (QueryError,
    QueryTooExpensive or InvalidArgument answer the peer)."""
    query = parse(text).bind(*args)
    check_cost(query)
    return query


def _deltas_size(deltas: Sequence[Delta]) -> int:
    return PAGE_ENVELOPE + sum(d.wire_size() for d in deltas)


def _pages(deltas: Iterable[Delta], page_bytes: int) -> Iterable[list[Delta]]:
    """``deltas`` cut into pages of about ``page_bytes`` (each at least one delta), in
    order. A state for an entity the page already has a delta for starts a new page: a
    receiver takes an update's states before its events, so in one page the state would
    come before the events it follows (several commits' changes go in one push)."""
    page: list[Delta] = []
    entities: set[EntityId] = set()
    size = 0
    for delta in deltas:
        delta_size = delta.wire_size()
        if page and (
            size + delta_size > page_bytes
            or len(page) >= MAX_BATCH_EVENTS
            or (delta.state is not None and delta.entity_id in entities)
        ):
            yield page
            page, size = [], 0
            entities.clear()
        page.append(delta)
        entities.add(delta.entity_id)
        size += delta_size
    if page:
        yield page


async def _paged_deltas(peer: Peer, request_id: int, deltas: AsyncIterator[Delta]) -> Message:
    """Send every page of ``deltas`` but the last (as it fills up); the last is the
    response itself. The first page aims at :data:`FIRST_PAGE_BYTES`, each next one at
    twice the last, up to :data:`ANSWER_PAGE_BYTES` (or the peer's page size); each goes
    out before the next is built, as soon as one more delta like its last would not fit:
    waiting for the next delta to find out could mean waiting for a storage read (a fresh
    client's first page went out after three reads instead of one)."""
    page: list[Delta] = []
    size = 0
    limit = min(FIRST_PAGE_BYTES, peer.page_bytes)
    async for delta in deltas:
        delta_size = delta.wire_size()
        if page and size + delta_size > limit:  # larger than the last: it opens the next
            page, size, limit = await _sent(peer, request_id, page, size, limit)
        page.append(delta)
        size += delta_size
        if size + delta_size > limit or len(page) >= MAX_BATCH_EVENTS:
            page, size, limit = await _sent(peer, request_id, page, size, limit)
    return DeltasResponse(request_id, tuple(page))


async def _sent(
    peer: Peer, request_id: int, page: list[Delta], size: int, limit: int
) -> tuple[list[Delta], int, int]:
    """Send ``page`` (of ``size`` bytes) as a page of the answer to ``request_id``; returns
    the next page, empty, its size and its limit (twice this one's, up to the page size)."""
    await peer.send(DeltasPage(request_id, tuple(page)), size=size + PAGE_ENVELOPE)
    await asyncio.sleep(0)  # the writer puts the page on the wire: the peer starts on it
    return [], 0, min(2 * limit, peer.page_bytes, ANSWER_PAGE_BYTES)


async def _paged_events(
    peer: Peer, request_id: int, events: Sequence[AdmittedEvent], *, generations: bool
) -> Message:
    """The events (with their generations, if asked) paged like :func:`_paged_deltas`."""
    start, size = 0, 0
    for i, event in enumerate(events):
        event_size = len(event.event.to_bytes()) + 16
        if i > start and (size + event_size > peer.page_bytes or i - start >= MAX_BATCH_EVENTS):
            part = events[start:i]
            page = EventsPage(request_id, *_events_fields(part, generations=generations))
            await peer.send(page, size=size + PAGE_ENVELOPE)
            start, size = i, 0
        size += event_size
    return EventsResponse(request_id, *_events_fields(events[start:], generations=generations))


def _events_fields(
    events: Sequence[AdmittedEvent], *, generations: bool
) -> tuple[tuple[Event, ...], tuple[int, ...]]:
    return tuple(e.event for e in events), tuple(
        e.generation for e in events
    ) if generations else ()
