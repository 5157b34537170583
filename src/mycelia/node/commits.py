"""Local commits: durable here at once; on an ephemeral node, pushed, confirmed or reverted.

ARCHITECTURE.md §7, "Local-first commits". A durable node's commit is done once it is
written (:class:`LocalCommits`). An ephemeral node's commit (:class:`CommitPipeline`):

1. **Local first.** The applier commits the transaction's events here — visible to reads
   and live queries at once — with the commit's outbox record in the same storage write.
   The commit joins the queue of owed commits, in commit order.
2. **Pipelined.** While a session with the durable peer is open, the sender pushes owed
   commits in order, up to :data:`WINDOW` in flight, in at most
   :data:`~mycelia.node.flight.FRAMES` frames not answered yet: the next frame carries
   every commit queued by then that fits it (a ``CommitsRequest``, with a verdict per
   commit in its answer). A commit the sender would send alone and at once (it waits
   for one, nothing is queued, the flight has room) is sent by the committing task
   itself, one task switch sooner. The peer applies one connection's commits in the
   order they arrive (grouping what arrives together into one write) and answers in that
   order. An Ack (or a commit's verdict) settles a commit where it arrives, oldest first
   (the answer's callback, :class:`~mycelia.node.flight.Flight`: its waiters wake, no
   task does; its record is deleted, in batches); any other answer is the confirmer's. An
   error answering a frame of several commits as a whole settles none of them, and from
   then on each goes alone.
3. **A refusal reverts, visibly** (what counts as one: :mod:`mycelia.node.refusals`).
   The pipeline closes its gate (new local commits wait), lets every commit in flight be
   answered, and takes out the refused commits and every owed commit built on them (by
   event parents, transitively). The entities they touch are fetched from the peer and
   reset to its state, with this node's other owed commits on them (those the peer does
   not hold yet) replayed on top, in one write that also settles the reverted records.
   Live queries show the change; waiters get the refusal
   (:class:`~mycelia.errors.CommitReverted` for a dependent, with the refusal as cause);
   :meth:`CommitPipeline.rejections` streams a :class:`Rejection` for each.
4. **A session that ends** leaves owed commits owed; the next one pushes them again (the
   peer deduplicates events by id), and a revert cut short by it happens then.
5. **A slow answer is not a lost one.** The confirmer gives up on a session only when the
   oldest commit's answer is late and nothing at all came from the peer for a whole
   request timeout (or after :data:`~mycelia.node.flight.BUSY_ROUNDS` timeouts of a peer
   that keeps sending; it looks once a timeout, :class:`~mycelia.node.flight.Lateness`,
   so a commit is given one to two): a loaded server answers late, and leaving it would
   push the commit again and subscribe again, adding to its load.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Final

from mycelia.entity import Applier, Entity, EventCheck, ForkBase
from mycelia.errors import (
    ConnectionClosed,
    InvalidArgument,
    MyceliaError,
    ProtocolError,
    RemoteError,
    RequestTimeout,
)
from mycelia.node.flight import (
    DONE,
    WINDOW,
    Flight,
    Gate,
    Lateness,
    Pending,
    SessionOver,
    answered,
    answers_each,
    either,
    verdicts,
)
from mycelia.node.outbox import Outbox, Owed
from mycelia.node.ports import Commit, MakeRequest, Session
from mycelia.node.refusals import (
    LATER,
    Later,
    Rejection,
    Rejections,
    doomed_by,
    not_held,
    peer_states,
    refusal_in,
)
from mycelia.proto import AdmittedEvent, EntityId, Event, Limits
from mycelia.proto.messages import Message
from mycelia.proto.peering import CommitRequest, CommitsRequest
from mycelia.retrieval import WriteBatch
from mycelia.storage import StorageEngine

__all__ = ["WINDOW", "CommitPipeline", "LocalCommits", "Rejection"]

log = logging.getLogger(__name__)

FRAME_MARGIN: Final = 64 * 1024
"""Room a commit request leaves in a frame for its envelope."""


class _SessionOver(Exception):
    """This session will give no more verdicts: stop pushing; the next one pushes again."""


class LocalCommits:
    """A durable node's commits: done once written here."""

    def __init__(self, applier: Applier) -> None:
        self._applier = applier

    def base(self, entity: Entity) -> ForkBase:
        """What a fork of ``entity`` taken now starts from."""
        return self._applier.base(entity)

    async def commit(
        self, events: Sequence[Event], *, bases: Mapping[EntityId, ForkBase], check: EventCheck
    ) -> Commit:
        """Commit here (durable once this returns)."""
        await self._applier.commit_local(events, bases=bases, check=check)
        return DONE


class CommitPipeline:
    """An ephemeral node's local commits and what it owes its durable peer (see above)."""

    def __init__(
        self,
        applier: Applier,
        outbox: Outbox,
        storage: StorageEngine,
        *,
        limits: Limits,
        ready: Callable[[], bool],
        request_timeout: float = 30.0,
    ) -> None:
        self._applier = applier
        self._outbox = outbox
        self._storage = storage
        self._limits = limits
        self.ready = ready
        """Whether the durable peer is connected and ready (the upstream says)."""
        self._timeout = request_timeout
        self._owed: dict[int, Pending] = {}
        self._queue: deque[Pending] = deque()
        self._wake = asyncio.Event()
        self._paused = False
        self._gate = Gate()
        self._over = SessionOver()
        self._to_settle: list[Owed] = []
        self._settle_wake = asyncio.Event()
        self._rejections = Rejections()
        self._batching = True
        """Whether owed commits queued together go in one frame (see _batch_answered)."""
        self._open: tuple[Session, Flight] | None = None
        """The session being served and its flight, while :meth:`serve` runs."""
        self._idle = False
        """Whether the sender waits for a commit, with nothing queued or in its hands."""

    async def load(self) -> None:
        """Take up the commits owed since an earlier run, and the heads its commits left
        unsure (call once, at open)."""
        for owed in await self._outbox.load():
            self._owed[owed.seq] = self._pending(owed)
        self._applier.unsure.keep(await self._outbox.unsure())

    # -- committing ----------------------------------------------------------------------

    def _pending(self, owed: Owed) -> Pending:
        return Pending(owed, ready=self.ready, over=self._over)

    def base(self, entity: Entity) -> ForkBase:
        """What a fork of ``entity`` taken now starts from."""
        return self._applier.base(entity)

    async def commit(
        self, events: Sequence[Event], *, bases: Mapping[EntityId, ForkBase], check: EventCheck
    ) -> Commit:
        """Commit here with the outbox record in the same write, then owe it (see above).

        Raises InvalidArgument for a commit too large to ever push, CommitReverted if an
        edited entity was reverted since its fork, PolicyDenied, StorageError; nothing is
        durable or owed then.
        """
        self._check_size(events)
        owed: Owed | None = None

        def record(staged: list[AdmittedEvent]) -> tuple[tuple[str, bytes | None], ...]:
            nonlocal owed
            owed = self._outbox.record(staged)
            return (owed.record(),)

        async with self._gate.shared():
            await self._applier.commit_local(events, bases=bases, check=check, record=record)
        if owed is None or not owed.events:
            return DONE
        pending = self._owed[owed.seq] = self._pending(owed)
        if not self._sent_at_once(pending):
            self._queue.append(pending)
            self._wake.set()
        return pending

    def _sent_at_once(self, pending: Pending) -> bool:
        """Send ``pending`` from the committing task if the sender would send it alone and
        at once (it waits for a commit, the flight has room): one task switch less between
        a commit and its frame. In order: nothing is queued and the sender holds nothing."""
        if self._open is None or not self._idle or self._paused or self._queue:
            return False
        session, flight = self._open
        if not flight.try_frame():
            return False
        size = pending.owed.wire_bytes
        if not flight.try_slot(size):
            flight.unsent()
            return False
        self._dispatch(session, flight, [(pending, size)])
        return True

    def _check_size(self, events: Sequence[Event]) -> None:
        limits = self._limits
        size = sum(len(e.to_bytes()) for e in events)
        if len(events) > limits.max_batch_events or size > limits.max_frame_bytes - FRAME_MARGIN:
            raise InvalidArgument(
                f"this transaction ({len(events)} events, {size} bytes) is too large to push "
                f"to the durable peer (at most {limits.max_batch_events} events and "
                f"{limits.max_frame_bytes - FRAME_MARGIN} bytes): split it into smaller ones"
            )

    def owed_count(self) -> int:
        """Local commits not confirmed by the durable peer yet."""
        return len(self._owed)

    def owed(self) -> list[Event]:
        """Every event owed to the durable peer, oldest commit first."""
        return [e.event for p in self._owed.values() for e in p.owed.events]

    def rejections(self) -> AsyncIterator[Rejection]:
        """Every rejection from now on (see :class:`Rejection`), as an async iterator."""
        return self._rejections.stream()

    # -- a session -------------------------------------------------------------------------

    async def serve(self, session: Session) -> None:
        """Push owed commits over ``session`` and take their answers, until it ends (an
        answer is late after the session's request timeout)."""
        self._timeout = session.request_timeout
        self._queue = deque(self._owed.values())
        self._over.begin()
        flight = Flight(self._confirmed, paused=lambda: self._paused)
        self._open = (session, flight)
        tasks = [
            asyncio.ensure_future(self._send(session, flight)),
            asyncio.ensure_future(self._confirm(session, flight)),
            asyncio.ensure_future(self._settle()),
        ]
        closed = asyncio.ensure_future(session.wait_closed())
        try:
            await asyncio.wait([closed, *tasks], return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._open = None
            closed.cancel()
            for task in tasks:
                task.cancel()
            for outcome in await asyncio.gather(*tasks, return_exceptions=True):
                if isinstance(outcome, Exception):
                    log.warning("the commit pipeline stopped: %r", outcome)
            await session.close()  # a pipeline that stopped ends its session: the next restarts
            await self._flush_settled()
            self._over.end()

    async def wait_pushed(self, session: Session) -> None:
        """Wait until every commit owed now is confirmed or reverted (or the session ends)."""
        waiting = [p.outcome() for p in self._owed.values()]
        if waiting:
            await either(asyncio.gather(*waiting, return_exceptions=True), session.wait_closed())

    async def _send(self, session: Session, flight: Flight) -> None:
        while True:
            pending = await self._next_unsent()
            await flight.frame()  # (while the frames before are unanswered, commits queue)
            size = pending.owed.wire_bytes
            await flight.slot(size)
            if self._paused or pending.owed.seq not in self._owed:
                flight.release(size)  # a revert began while we waited: it decides first
                flight.unsent()
                if pending.owed.seq in self._owed:
                    self._queue.appendleft(pending)
                continue
            batch = [(pending, size), *self._more_unsent(flight, size, len(pending.owed.events))]
            self._dispatch(session, flight, batch)

    def _dispatch(self, session: Session, flight: Flight, batch: list[tuple[Pending, int]]) -> None:
        """Send ``batch`` (owed commits in order, each with its slot's size) in one frame,
        whose place in the flight is taken."""
        if len(batch) == 1:
            pending, size = batch[0]
            answer = session.submit(_commit_request(pending.owed))
            flight.add(pending, answer, size)
        else:
            answer = session.submit(_commits_request([p.owed for p, _ in batch]))
            answer.add_done_callback(functools.partial(self._batch_answered, count=len(batch)))
            for (each, each_size), part in zip(batch, verdicts(answer, len(batch)), strict=True):
                flight.add(each, part, each_size)
        flight.sent(answer)

    def _more_unsent(self, flight: Flight, size: int, events: int) -> list[tuple[Pending, int]]:
        """The owed commits queued after one of ``size`` bytes and ``events`` events that
        fit in its frame and the window now (none once batches are off)."""
        limits, queue = self._limits, self._queue
        room = limits.max_frame_bytes - FRAME_MARGIN
        more: list[tuple[Pending, int]] = []
        while self._batching and queue and 1 + len(more) < limits.max_batch_commits:
            pending = queue[0]
            if pending.owed.seq not in self._owed:
                queue.popleft()  # settled or reverted meanwhile
                continue
            next_size, next_events = pending.owed.wire_bytes, len(pending.owed.events)
            if (
                size + next_size > room
                or events + next_events > limits.max_batch_events
                or not flight.try_slot(next_size)
            ):
                break
            queue.popleft()
            more.append((pending, next_size))
            size, events = size + next_size, events + next_events
        return more

    def _batch_answered(self, answer: asyncio.Future[Message], count: int) -> None:
        """A peer that refuses commits sent together as a whole (its limits are below
        ours), or answers them with anything but a verdict each, gets one commit per frame
        from now on: each commit then gets its own verdict."""
        if answer.cancelled() or isinstance(answer.exception(), ConnectionClosed):
            return
        error = answer.exception()
        if error is None and answers_each(answer.result(), count):
            return
        if self._batching:
            log.warning(
                "the durable peer did not take %d commits sent together (%s): sending one "
                "per frame from now on",
                count,
                error or type(answer.result()).__name__,
            )
        self._batching = False

    async def _next_unsent(self) -> Pending:
        """The oldest owed commit not sent in this session (waits while paused or none)."""
        while True:
            while self._paused or not self._queue:
                self._wake.clear()
                self._idle = True
                try:
                    await self._wake.wait()
                finally:
                    self._idle = False
            pending = self._queue.popleft()
            if pending.owed.seq in self._owed:
                return pending  # (else settled or reverted meanwhile)

    async def _confirm(self, session: Session, flight: Flight) -> None:
        """Take the answers the flight leaves to the confirmer (its Acks confirm
        themselves): the oldest commit's answer that is no Ack, or none in time."""
        lateness = Lateness(lambda: session.frames_read, self._timeout)
        while True:
            try:
                found = await flight.unacked(self._timeout, lateness)
                if isinstance(found, str):
                    raise _SessionOver(found)
                pending, future = found
                verdict = await self._answer(session, future)  # (in: taken at once)
                flight.pop()
                if verdict is None:
                    self._confirmed(pending)
                elif isinstance(verdict, Later):
                    raise _SessionOver(
                        f"the durable peer could not take commit {pending.owed.seq} now"
                    )
                else:
                    await self._revert(session, flight, {pending.owed.seq: verdict})
            except _SessionOver as exc:
                log.info("pushing commits stopped (%s): the next session pushes them again", exc)
                await session.close()
                return

    async def _answer(
        self, session: Session, future: asyncio.Future[Message]
    ) -> MyceliaError | Later | None:
        """The peer's verdict on one commit: None (confirmed), its refusal, or LATER.

        Raises _SessionOver when there will be no verdict in this session: it closed, or
        the answer is late and the peer sent nothing for a whole timeout (or kept sending
        for the busy rounds: stuck on this commit; see the module docstring).
        """
        late = await answered(future, lambda: session.frames_read, self._timeout)
        if late is not None:
            raise _SessionOver(late)
        try:
            future.result()
        except RemoteError as exc:
            refusal = refusal_in(exc)
            if refusal is None:
                log.info("the durable peer could not take a commit now: %s", exc)
                return LATER
            return refusal
        except ConnectionClosed as exc:
            raise _SessionOver(str(exc) or "the connection closed") from exc
        return None

    def _confirmed(self, pending: Pending) -> None:
        self._owed.pop(pending.owed.seq, None)
        self._to_settle.append(pending.owed)  # (before succeed() lets go of its events)
        pending.succeed()
        self._settle_wake.set()  # (after: its waiters run first, settling after them)

    async def _settle(self) -> None:
        while True:
            await self._settle_wake.wait()
            self._settle_wake.clear()
            await self._flush_settled()

    async def _flush_settled(self) -> None:
        done, self._to_settle = self._to_settle, []
        if done:
            try:
                await self._storage.write(WriteBatch(meta=Outbox.settled(done)))
            except MyceliaError as exc:  # harmless: settled records are pushed once more
                log.warning("could not settle %d confirmed commits: %s", len(done), exc)
        await self._applier.unsure.tidy()  # the peer holds what a confirmed commit built on

    # -- reverting -------------------------------------------------------------------------

    async def _revert(
        self, session: Session, flight: Flight, refused: dict[int, MyceliaError]
    ) -> None:
        self._paused = True
        later: list[int] = []
        try:
            async with self._gate.exclusive():
                while flight:  # every commit in flight is answered before anything moves
                    pending, future = flight.pop()
                    verdict = await self._answer(session, future)
                    if verdict is None:
                        self._confirmed(pending)
                    elif isinstance(verdict, Later):
                        later.append(pending.owed.seq)
                    else:
                        refused[pending.owed.seq] = verdict
                doomed = doomed_by({s: p.owed for s, p in self._owed.items()}, refused)
                try:
                    await self._reset(session, doomed)
                except (ConnectionClosed, RequestTimeout, ProtocolError) as exc:
                    raise _SessionOver(
                        f"the durable peer went away while reverting: {exc}"
                    ) from exc
        finally:
            self._paused = False
            self._wake.set()
        if any(seq not in doomed for seq in later):
            raise _SessionOver("the durable peer could not take some commits now")

    async def _reset(self, session: Session, doomed: dict[int, MyceliaError]) -> None:
        gone = [self._owed[seq] for seq in sorted(doomed)]
        entities = sorted({e for p in gone for e in p.owed.entities})
        touched = set(entities)
        kept = [p for s, p in self._owed.items() if s not in doomed and p.owed.entities & touched]
        limits = self._limits
        states = await peer_states(session, entities, step=limits.max_clock_width)
        with_state = {e for e, s in states.items() if s}
        mine = [e for p in kept for e in p.owed.events if e.entity_id in with_state]
        replay = await not_held(session, mine, step=limits.max_batch_events)
        settled = Outbox.settled(p.owed for p in gone)
        await self._applier.reset(states, replay=replay, meta=settled)
        for pending in gone:
            error = doomed[pending.owed.seq]
            self._owed.pop(pending.owed.seq, None)
            log.warning("the durable peer refused local commit %d: %s", pending.owed.seq, error)
            pending.fail(error)
            self._rejections.publish(
                Rejection(pending.owed.ids, tuple(sorted(pending.owed.entities)), error)
            )


def _commit_request(owed: Owed) -> MakeRequest:
    events = tuple(e.event for e in owed.events)
    return lambda rid: CommitRequest(rid, events)


def _commits_request(owed: list[Owed]) -> MakeRequest:
    commits = tuple(tuple(e.event for e in o.events) for o in owed)
    return lambda rid: CommitsRequest(rid, commits)
