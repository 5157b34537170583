"""The upstream: the one owner of a node's durable peer (ARCHITECTURE.md §7).

A node has one :class:`Upstream`; it talks to the durable peer only through its
:class:`~mycelia.node.link.Link`, which holds the current session and the one definition
of connection state and readiness (:class:`~mycelia.node.link.ConnectionState`). A
:class:`~mycelia.node.client.Connection` dials and redials; for each session it opens,
the upstream **prepares** it before the link turns READY:

1. joins the peer's system if this node has none (a node of another system is refused at
   the handshake);
2. pushes every owed commit and takes the answers (refusals revert, see
   :mod:`mycelia.node.commits`); the pipeline keeps pushing for the whole session;
3. re-establishes every live query's subscription with the heads held here, so it
   catches up with bridges or snapshots and learns what left each query meanwhile; once
   answered, a query reads its result from the rows the peer keeps current for it
   (:mod:`mycelia.node.kept`).

It also reads through (``get``, ``fetch`` and ``trx.edit`` ask the peer first, unless the
entity is held and kept current by a subscription), applies what the peer sends (states
merged, events ingested, missing parents fetched), and answers the applier's requests for
history this node does not hold (:meth:`~mycelia.node.link.Link.get_events`).

Offline (no session, or one not ready yet) everything answers from what is here. But a
read-through whose request was sent and whose connection then closed raises
:class:`~mycelia.errors.ConnectionClosed`: the answer was lost (it may have been paged
over several frames), and answering from here would pass a partial or empty result off
as the peer's. A subscription the peer does not answer in time ends the session, as a
dead peer's would: the next one subscribes again (going on with this one would leave the
query unmirrored, looking current).

A subscription the peer ends (:class:`~mycelia.proto.peering.SubscriptionEnded`: the
credentials expired, say) or refuses (a peer holding its most subscriptions, say) is not
mirrored again; its live query is told the typed error when it can take one
(:class:`Ends`), and one being opened raises it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection, Coroutine, Iterable, Sequence
from typing import Final, Protocol, TypeVar, runtime_checkable

from mycelia.entity import Applier, Entity, EntityChange, IngestResult
from mycelia.errors import (
    ConnectionClosed,
    DecodeError,
    EventNotFound,
    LineageError,
    MyceliaError,
    NotConnected,
    RequestTimeout,
    RetrievalError,
    remote,
)
from mycelia.node.asks import ask_events, ask_get, deltas_of
from mycelia.node.commits import CommitPipeline
from mycelia.node.deltas import query_rows
from mycelia.node.inbox import Inboxed, next_step, unplaced
from mycelia.node.kept import KeptRows, named_heads
from mycelia.node.link import Link
from mycelia.node.ports import MakeRequest, Session, Standing
from mycelia.proto import Clock, EntityId, Event, EventId
from mycelia.proto.limits import MAX_BATCH_EVENTS
from mycelia.proto.messages import Message
from mycelia.proto.peering import (
    Delta,
    DeltasResponse,
    EventsResponse,
    FetchRequest,
    GetRequest,
    KnownEntity,
    SubscribeRequest,
    SubscriptionEnded,
    SubscriptionUpdate,
    SystemRequest,
    UnsubscribeRequest,
)
from mycelia.proto.query import Query
from mycelia.retrieval import StoredState
from mycelia.storage import StorageEngine

__all__ = ["MAX_FETCH_ROUNDS", "Ends", "Upstream"]

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)

MAX_FETCH_ROUNDS: Final = 64
"""Rounds of asking the peer for missing parents before events are left pending."""


@runtime_checkable
class Ends(Protocol):
    """A live query that can be told its durable peer ended its subscription."""

    def end(self, error: MyceliaError) -> None:
        """The peer will push nothing more for it: ``error`` says why."""
        ...


class Upstream:
    """Everything a node does with its durable peer; see the module docstring."""

    def __init__(
        self,
        link: Link,
        applier: Applier,
        storage: StorageEngine,
        *,
        durable: bool,
        tracked: Callable[[EntityId], bool],
        join_system: Callable[[Sequence[Event]], Awaitable[None]],
        has_system: Callable[[], bool],
        commits: CommitPipeline | None = None,
    ) -> None:
        self._link = link
        self._applier = applier
        self._storage = storage
        self._durable = durable
        self._tracked = tracked
        self._join_system = join_system
        self._has_system = has_system
        self._commits = commits
        self._following: dict[int, Standing] = {}
        self._kept = KeptRows()
        self._inbox: list[Inboxed] = []
        """Pushed updates read and not applied yet, in order (see :meth:`on_update`)."""
        self._more = asyncio.Event()
        """Set when an update joins the inbox (the session's worker waits on it)."""
        self._applying = False
        self._sessions = 0
        """Sessions prepared so far: the work applying updates belongs to one of them."""
        self._serving: dict[asyncio.Task[None], None] = {}

    # -- sessions ----------------------------------------------------------------------

    async def prepare(self, session: Session) -> None:
        """Make a new session usable before the link turns READY (see the module docstring).

        Raises what a step raised; the connection then drops the session and redials.
        """
        # Updates of an ended session are not applied (its work may have been cancelled
        # before it ran): the subscriptions below bring what they said.
        self._sessions += 1
        self._inbox.clear()
        self._kept.new_session()
        self._applying = False
        if not self._has_system():
            response = await session.request(SystemRequest, expect=EventsResponse)
            await self._join_system(response.events)
        if self._commits is not None:
            task = asyncio.ensure_future(self._commits.serve(session))
            self._serving[task] = None
            task.add_done_callback(lambda done: self._serving.pop(done, None))
            await self._commits.wait_pushed(session)
        for live in list(self._following.values()):
            await self._subscribe(session, live)
        await self._applier.unsure.tidy()  # heads a commit left unsure (mycelia.entity.unsure)

    async def stopped(self) -> None:
        """Wait until the work of ended sessions is finished (the node is closing)."""
        if self._serving:
            await asyncio.gather(*self._serving, return_exceptions=True)

    def on_update(self, update: Inboxed) -> Coroutine[object, object, None] | None:
        """Take an update the durable peer pushed for one of our subscriptions (or its end
        of one, see the module docstring), as the connection reads it. The session's first
        update returns the work that applies updates for the rest of the session, for a
        task of the connection; later ones return ``None`` (that work takes them).

        Updates read while earlier ones are being applied wait in order, and the next step
        applies every waiting one together (:func:`next_step`): one ingest, one storage
        write per entity, one change set per live query. So a subscriber that falls behind
        catches up in fewer, larger steps; one that keeps up applies each update alone, as
        it comes.

        If an update cannot be applied, carrying on would leave the peer believing this
        node holds what it does not, and nothing would ever correct it. Events whose
        parents the peer did not send in time (:class:`~mycelia.errors.EventNotFound`: it
        is overloaded, say) re-subscribe their queries with the heads really held here, and
        the answer brings what they lack; anything else (a storage write failed, say)
        closes the session, and the next one re-subscribes every query.
        """
        self._inbox.append(update)
        self._kept.read()
        self._more.set()
        if self._applying:
            return None
        self._applying = True
        return self._apply_inbox(self._sessions)

    async def _apply_inbox(self, session: int) -> None:
        """The session's one worker: applies what waits in the inbox, a step at a time, then
        waits for more. It lives as long as the connection (whose closing cancels it):
        waking a waiting task costs a fraction of starting one per update."""
        try:
            while session == self._sessions:  # (a new session's updates are its own)
                if not self._inbox:
                    self._more.clear()
                    await self._more.wait()
                    continue
                await self._apply_next()
        finally:
            if session == self._sessions:  # (else a new session started afresh meanwhile)
                self._applying = False
                # Cancelled with updates waiting (the session is closing): the next session
                # subscribes again with the heads held here, which brings what they said.
                self._inbox.clear()

    async def _apply_next(self) -> None:
        """Apply the next step off the inbox. (Its own frame: a worker waiting for more
        holds nothing of what it applied, which a hundred clients in one process would keep
        for the garbage collector to visit.)"""
        try:
            step = next_step(self._inbox)
        except MyceliaError as exc:  # a malformed frame: its session ends
            self._inbox.clear()
            await self._reconnect(f"the durable peer pushed a malformed update ({exc})")
            return
        await self._apply_step(step, self._kept.received - len(self._inbox) - len(step))

    async def _apply_step(
        self, step: list[SubscriptionUpdate | SubscriptionEnded], arrival: int
    ) -> None:
        """Apply a step of updates (``arrival``: the first's index among those read)."""
        first = step[0]
        if isinstance(first, SubscriptionEnded):
            self._ended(first)
            return
        updates = [u for u in step if isinstance(u, SubscriptionUpdate)]
        kept = self._kept
        noted = [
            (u.query_id, *kept.note(u.query_id, u.deltas, arrival + i))
            for i, u in enumerate(updates)
        ]
        try:
            await self.apply_deltas(d for u in updates for d in u.deltas)
        except EventNotFound as exc:
            session = self._link.session
            for query_id, entities in (await unplaced(self._storage, updates)).items():
                live = self._following.get(query_id)
                log.info("resubscribing query %s: %s", query_id, exc)
                if live is not None and session is not None:
                    await self._subscribe(session, live, afresh=entities)
        except MyceliaError as exc:
            await self._reconnect(f"could not apply an update from the durable peer ({exc})")
        for query_id, gained, lost in noted:  # (applied, or asked for again)
            if (gained or lost) and (live := self._following.get(query_id)) is not None:
                live.kept_changed(gained, lost)

    async def _reconnect(self, why: str) -> None:
        """End the session (the next one subscribes again, with the heads held here)."""
        log.warning("%s: reconnecting", why)
        session = self._link.session
        if session is not None:
            await session.close()

    def _ended(self, ended: SubscriptionEnded) -> None:
        error = remote(ended.code, ended.text)
        self._unmirrored(ended.query_id, "ended the subscription of", error)

    def _unmirrored(self, query_id: int, what: str, error: MyceliaError) -> None:
        """The durable peer will not mirror a query: it is not asked again, and its live
        query is told why (a live query kept open unmirrored would look current and never
        change again)."""
        live: object = self._following.pop(query_id, None)
        self._kept.forget(query_id)
        log.warning("the durable peer %s query %s: %s", what, query_id, error)
        if isinstance(live, Ends):
            live.end(error)

    # -- read-through --------------------------------------------------------------------

    def connected(self) -> bool:
        """Whether the durable peer is connected and ready."""
        return self._link.ready

    async def entity(self, entity_id: EntityId) -> Entity | None:
        """The entity, refreshed from the durable peer unless a subscription keeps it."""
        if self._link.ready and not self._tracked(entity_id):
            held = await self._applier.load(entity_id)
            known = (KnownEntity(entity_id, held.head.ids),) if held and held.exists else ()
            await self._ask_deltas(lambda rid: GetRequest(rid, (entity_id,), known))
        return await self._applier.load(entity_id)

    async def rows(
        self, collection: str, query: Query, text: str, args: tuple[object, ...]
    ) -> list[StoredState]:
        """The rows matching ``query`` here, after the durable peer sent what is missing."""
        if self._link.ready:
            known = tuple(
                KnownEntity(s.state.entity_id, s.state.state.head.ids)
                for s in await query_rows(self._storage, collection, query)
            )
            await self._ask_deltas(lambda rid: FetchRequest(rid, collection, text, args, known))
        return await query_rows(self._storage, collection, query)

    async def _ask_deltas(self, make: MakeRequest) -> None:
        """Ask and apply. Raises ConnectionClosed if the connection closed with the
        request sent (its answer is lost); offline after all, it answers from here."""
        try:
            response = await self._link.request(make, expect=DeltasResponse)
        except (NotConnected, RequestTimeout):
            return  # offline after all: answer from what is here
        with contextlib.suppress(DecodeError, LineageError, RetrievalError):
            await self.apply_deltas(response.deltas)  # (logged) answer from what is here

    # -- live queries --------------------------------------------------------------------

    async def follow(self, live: Standing) -> None:
        """Mirror ``live`` on the durable peer now (if a session is open) and after every
        reconnect."""
        self._following[live.query_id] = live
        session = self._link.session
        if session is not None:
            await self._subscribe(session, live)

    def kept(self, live: Standing) -> Collection[EntityId] | None:
        """The entities the durable peer keeps current for ``live`` (see
        :mod:`mycelia.node.kept`; ``None`` while it is not mirrored)."""
        session = self._sessions if self._link.session is not None else None
        return self._kept.of(live.query_id, session)

    async def resubscribe(self, live: Standing) -> None:
        """Mirror ``live`` again (its query changed)."""
        session = self._link.session
        if session is not None and live.query_id in self._following:
            await self._subscribe(session, live)

    async def unfollow(self, live: Standing) -> None:
        """Stop mirroring ``live`` (offline is fine: the peer forgets a closed link's)."""
        if self._following.pop(live.query_id, None) is None:
            return
        self._kept.forget(live.query_id)
        qid = live.query_id
        with contextlib.suppress(ConnectionClosed, RequestTimeout):
            await self._link.request(lambda rid: UnsubscribeRequest(rid, qid), expect=Message)

    async def _subscribe(
        self, session: Session, live: Standing, *, afresh: Collection[EntityId] = ()
    ) -> None:
        """Mirror one query on the peer, sending the heads held here — but an empty one for
        the entities ``afresh``: the peer then sends their states whole, merged here as any
        snapshot (values by their CRDTs, the head by comparison), or says they left."""
        known = await named_heads(self._storage, live, afresh)
        # A peer decodes at most MAX_BATCH_EVENTS known heads: the rest are asked after.
        known, unnamed = known[:MAX_BATCH_EVENTS], known[MAX_BATCH_EVENTS:]
        collection, text, args, qid = live.collection, live.text, live.args, live.query_id
        # Each page is applied as it arrives, while the peer builds the next: a fresh
        # client's answer of 1,000 entities took the peer 15 ms and this node 56, one
        # after the other. A page that cannot be applied does not stop the others; a
        # failure to apply one otherwise (a storage write) is raised, as the answer's
        # would be: the peer believes this node holds what it sent.
        refused: list[tuple[tuple[Delta, ...], MyceliaError]] = []
        answered: set[EntityId] = set()
        ask = session.stream(
            lambda rid: SubscribeRequest(rid, qid, collection, text, args, tuple(known))
        )
        self._kept.start(qid, ask.responded)
        async with ask as parts:
            while True:
                try:  # the answer's own failures
                    part = await anext(parts, None)
                    deltas = None if part is None else deltas_of(part)
                except ConnectionClosed:
                    return  # the session is ending: the next one subscribes again
                except RequestTimeout as exc:  # (see the module docstring)
                    log.warning("no answer to subscribing query %s: reconnecting (%s)", qid, exc)
                    await session.close()
                    return
                except MyceliaError as exc:  # refused: asking again would be refused again
                    self._unmirrored(qid, "refused to mirror", exc)
                    return
                if deltas is None:
                    break
                answered.update(d.entity_id for d in deltas)
                self._kept.page(qid, deltas)
                try:
                    await self.apply_deltas(deltas)
                except (DecodeError, LineageError, RetrievalError) as exc:
                    refused.append((deltas, exc))
        await self._ask_unnamed([k for k in unnamed if k.entity_id not in answered])
        if refused:
            await self._refused_answer(session, live, afresh, refused)
            return
        self._answered(live, known, answered)

    def _answered(self, live: Standing, known: Sequence[KnownEntity], said: set[EntityId]) -> None:
        """``live``'s subscription is answered whole: it is mirrored from now on, reading
        its result from the rows the peer keeps current for it (:mod:`mycelia.node.kept`)."""
        qid = live.query_id
        self._kept.answered(qid, self._sessions, (k.entity_id for k in known), said)
        kept = self._kept.of(qid, self._sessions) or set()
        live.kept_changed(kept, [e for e in live.member_ids() if e not in kept])

    async def _refused_answer(
        self,
        session: Session,
        live: Standing,
        afresh: Collection[EntityId],
        refused: list[tuple[tuple[Delta, ...], MyceliaError]],
    ) -> None:
        """Pages of a subscription's answer could not be applied: a bridge from a head held
        here whose history below is not here (an ephemeral node's snapshot boundary) asks
        for those states whole, once; anything else ends the session."""
        first, qid = refused[0][1], live.query_id
        bridged = {d.entity_id for deltas, _ in refused for d in deltas if d.events}
        gapped = bridged - set(afresh) if isinstance(first, EventNotFound) else set()
        if gapped:
            log.info("subscribing query %s again, %d states whole: %s", qid, len(gapped), first)
            await self._subscribe(session, live, afresh={*afresh, *gapped})
            return
        log.warning("resubscribing query %s after a refused answer (%s)", qid, first)
        await session.close()  # the next session subscribes again, with the heads held

    async def _ask_unnamed(self, unnamed: Sequence[KnownEntity]) -> None:
        """Bring up to date the members a subscription could not name (past the heads a
        peer decodes) and its answer did not send: every row of the result the answer did
        not know of is in it, so these left the query (a live query of 10,500 members ended
        on its first reconnect, refused for its heads). Another session asks again."""
        for start in range(0, len(unnamed), MAX_BATCH_EVENTS):
            with contextlib.suppress(ConnectionClosed):
                await self._ask_deltas(ask_get(unnamed[start : start + MAX_BATCH_EVENTS]))

    # -- what the peer sends -----------------------------------------------------------

    async def apply_deltas(self, deltas: Iterable[Delta]) -> list[EntityChange]:
        """Apply deltas from the durable peer (states merged, events ingested, gaps filled).

        Every delta that fits is applied; then raises the first refusal if some did not,
        or EventNotFound if events still lack parents the peer did not send (the caller
        decides: a pushed update re-subscribes or reconnects, a read-through answers from
        here).
        """
        deltas = tuple(deltas)
        changes: list[EntityChange] = []
        events = [e for d in deltas for e in d.events]
        states = [d.state for d in deltas if d.state is not None]
        # An ephemeral node trusts its durable peer's states, so also its word that a state
        # descends from the head held here; a durable node takes no head on a peer's word.
        bases = {
            d.entity_id: Clock(d.base)
            for d in deltas
            if d.state is not None and d.base is not None and not self._durable
        }
        refused: dict[EntityId, MyceliaError] = {}
        if states:
            merged = await self._applier.ingest_states(states, bases=bases)
            changes.extend(merged.changes)
            refused.update(merged.errors)
        if events:
            result = await self._applier.ingest(events)
            refused.update(result.errors)
            changes.extend(result.changes)
            changes.extend(await self._fill_gaps(result, events))
        for entity_id, error in refused.items():  # (history not here yet: the caller heals it)
            level = logging.INFO if isinstance(error, EventNotFound) else logging.WARNING
            log.log(level, "could not apply what the peer sent for %s: %s", entity_id, error)
        if refused:
            raise next(iter(refused.values()))
        return changes

    async def _fill_gaps(self, result: IngestResult, sent: Sequence[Event]) -> list[EntityChange]:
        """Ask the peer for parents nobody here has, until the held events apply; raises
        EventNotFound (after applying what did) if some are still missing, or if events
        the peer ``sent`` are still held for want of history below them (an ephemeral
        node's snapshot boundary: the caller then asks for the entity's state whole)."""
        changes: list[EntityChange] = []
        missing: set[EventId] = set(result.missing)
        for _ in range(MAX_FETCH_ROUNDS):
            if not missing:
                break
            ids = tuple(sorted(missing))
            try:
                response = await self._link.request(ask_events(ids), expect=EventsResponse)
            except (ConnectionClosed, RequestTimeout):
                break
            if not response.events:
                break
            more = await self._applier.ingest(response.events)
            changes.extend(more.changes)
            missing = (missing | more.missing) - {e.id for e in more.stored}
            missing -= {e.id for e in response.events}
        if missing:
            first = min(missing)
            raise EventNotFound(
                f"the durable peer did not send {len(missing)} events the update needs "
                f"(such as {first})",
                event_id=first,
            )
        held = sorted(e.id for e in sent if e.id in self._applier.pending)
        if held:
            raise EventNotFound(
                f"{len(held)} events the durable peer sent still wait for history below "
                f"them (such as {held[0]})",
                event_id=held[0],
            )
        return changes
