"""How a node builds its parts and wires them together: :class:`Wiring`, the base of
:class:`~mycelia.node.Node`.

:class:`~mycelia.node.Node` is the public face (opening, the system root, contexts,
ingesting, peers, closing; :mod:`mycelia.node.node`); this module is its constructor and
the private wiring behind it: one factory per part, in the order the parts depend on
each other (ARCHITECTURE.md §7, STYLE.md §9), and the node's own callbacks that the parts
are given (change notification, tasks, entropy, progress).

Invariants:

- Every part is built once, in :meth:`Wiring.__init__` (a peer connection once per
  connection, by the session factory built there), and no part gets the node: each is
  given the narrow ports of :mod:`mycelia.node.ports` it needs, or callables, and the
  node exposes none of them.
- What a part reads of the node's state (the system root, whether it is closed) it reads
  through a callable, at the time it needs it, never as a copy taken at construction.
- Changes reach the live queries, then the served subscriptions, then every listener, in
  commit order; a failing listener is logged and never breaks a commit. A task the node
  spawns is kept until it ends, and its failure is logged, not lost.
- A node logs under one name, ``mycelia.node.node``, whichever of its two modules the line
  comes from (operators select it; a client's sync progress is logged there).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import secrets
from collections.abc import Awaitable, Callable, Collection, Coroutine, Iterable
from functools import partial

from mycelia.entity import Applier, EntityChange, EventCheck, IngestResult, PendingPool, Residents
from mycelia.entity.backends import ClientIds
from mycelia.errors import NodeClosed
from mycelia.node.client import Connection
from mycelia.node.combining import CommitCombiner
from mycelia.node.commits import CommitPipeline, LocalCommits
from mycelia.node.context import ContextParts
from mycelia.node.deltas import query_rows
from mycelia.node.feed import FeedFollower, follows
from mycelia.node.identity import NodeKey
from mycelia.node.link import Link
from mycelia.node.live import LiveParts
from mycelia.node.outbox import Outbox
from mycelia.node.peer import PeerConnection
from mycelia.node.peer_parts import Identity
from mycelia.node.policy import Gatekeeper, PolicyAgent
from mycelia.node.ports import ChangeListener
from mycelia.node.progress import Slow
from mycelia.node.reactor import Reactor
from mycelia.node.serving import Responder
from mycelia.node.transaction import TransactionParts
from mycelia.node.transport import Transport
from mycelia.node.upstream import Upstream
from mycelia.proto import AdmittedEvent, EntityId, Event, Limits
from mycelia.storage import StorageEngine

__all__ = ["Wiring"]

log = logging.getLogger("mycelia.node.node")


class Wiring:
    """A node's parts, built and wired by its constructor (the base of
    :class:`~mycelia.node.Node`, which is the only class built on it)."""

    system_events: Callable[[], Awaitable[list[AdmittedEvent]]]
    """The events that define the node's system (:meth:`mycelia.node.Node.system_events`;
    the responder answers a peer's System request with them)."""
    join_system: Callable[[Iterable[Event | AdmittedEvent]], Awaitable[None]]
    """Adopt a system (:meth:`mycelia.node.Node.join_system`; the upstream joins the
    durable peer's)."""

    def __init__(
        self,
        storage: StorageEngine,
        *,
        durable: bool,
        policy: PolicyAgent,
        limits: Limits,
        root: EntityId | None,
        key: NodeKey,
        rng: random.Random | None = None,
        progress: bool = True,
    ) -> None:
        self._storage = storage
        self._progress = progress
        self._received = 0
        """Entities changed here so far (a slow sync's progress counts them)."""
        self._policy = policy
        self._durable = durable
        self._limits = limits
        self._root = root
        self._key = key
        self._rng = rng
        self._listeners: list[ChangeListener] = []
        self._hearing_all = 0
        """Listeners that hear of every change (see :meth:`on_change`)."""
        self._tasks: dict[asyncio.Task[None], None] = {}  # ordered: cancelled in start order
        self._closed = False
        self._query_ids = itertools.count(1)
        self._residents = Residents()
        self._link = Link()
        self._applier = self._new_applier()
        self._combiner = CommitCombiner(
            lambda commits, checks, parts: self._applier.commit_many(
                commits, check=checks, parts=parts
            ),
            self._spawn,
        )
        self._reactor = Reactor()
        self._responder = self._new_responder()
        self._pipeline = self._new_pipeline()
        self._upstream = self._new_upstream()
        self._feed = self._new_feed()
        if self._feed is not None:
            self._listeners.append(self._feed.reported)
        self._gate = Gatekeeper(policy, lambda: self._root)
        self._me = Identity(key, durable, limits, lambda: self._root, self._entropy)
        self._session = partial(
            PeerConnection, me=self._me, gate=self._gate, answers=self._responder
        )
        """A session with a peer: this node's identity, gate and answers."""
        self._connection: Connection | None = None
        self._parts = self._new_parts()

    # -- wiring ----------------------------------------------------------------------------

    def _new_applier(self) -> Applier:
        """The applier over this node's storage and residents; an ephemeral node asks the
        durable peer (through the link) for the events it lacks."""
        storage = self._storage
        return Applier(
            storage,
            self._residents,
            durable=self._durable,
            system_root=lambda: self._root,
            remote=None if self._durable else self._link.get_events,
            on_change=self._notify,
            pending=PendingPool(),
            max_entity_bytes=self._limits.max_entity_bytes,
            sole_writer=not follows(storage),
        )

    def _new_responder(self) -> Responder:
        """What answers the requests of the peers this node serves."""
        return Responder(
            self._applier,
            self._storage,
            policy=self._policy,
            commit=self._commit_remote,
            system_events=self.system_events,
        )

    def _new_pipeline(self) -> CommitPipeline | None:
        """An ephemeral node's commit pipeline (local commits owed to the durable peer,
        kept in an outbox); ``None`` on a durable node, which commits locally."""
        if self._durable:
            return None
        return CommitPipeline(
            self._applier,
            Outbox(self._storage),
            self._storage,
            limits=self._limits,
            ready=lambda: self._link.ready,
        )

    def _new_upstream(self) -> Upstream:
        """The node's side of its durable peer: reads through it, subscriptions kept with
        it, and (ephemeral nodes) the commit pipeline pushed to it."""
        return Upstream(
            self._link,
            self._applier,
            self._storage,
            durable=self._durable,
            tracked=self._reactor.tracked,
            join_system=self.join_system,
            has_system=lambda: self._root is not None,
            commits=self._pipeline,
        )

    def _new_feed(self) -> FeedFollower | None:
        """A follower of the store's feed when other processes write this store, so the
        node hears of their commits; ``None`` when this node is its only writer."""
        if not follows(self._storage):
            return None
        notify, lock = self._notify, self._applier.locks.held
        return FeedFollower(
            self._storage, residents=self._residents, lock=lock, notify=notify, shows=self._shows
        )

    def _shows(self) -> Collection[str] | None:
        """The collections whose changes this node shows: its live queries' and the served
        subscriptions' (``None``: all of them, while a listener hears of everything)."""
        if self._hearing_all:
            return None
        return {*self._reactor.collections(), *self._responder.collections()}

    def _new_parts(self) -> ContextParts:
        """What the node's contexts work with: transactions, live queries, history."""
        return ContextParts(
            self._transaction_parts(),
            self._live_parts(),
            history=self._storage.events_of,
        )

    def _transaction_parts(self) -> TransactionParts:
        """What transactions work with: reads through the upstream, commits through the
        pipeline (ephemeral) or straight to the applier (durable)."""
        rng = self._rng
        text_ids = ClientIds(rng if rng is not None else random.Random(secrets.randbits(64)))
        commits = self._pipeline or LocalCommits(self._applier)
        return TransactionParts(
            reads=self._upstream,
            commits=commits,
            policy=self._policy,
            system_root=lambda: self._root,
            limits=self._limits,
            text_ids=text_ids,
            entropy=self._entropy,
            durable=self._durable,
            check_open=self._check_open,
        )

    def _live_parts(self) -> LiveParts:
        """What live queries work with: the reactor watches this node's changes, the
        upstream mirrors each query at the durable peer."""
        storage = self._storage
        return LiveParts(
            watch=self._reactor,
            follow=self._upstream,
            rows=lambda collection, query: query_rows(storage, collection, query),
            policy=self._policy,
            spawn=self._spawn,
            query_ids=lambda: next(self._query_ids),
            check_open=self._check_open,
            slow=None if self._durable else self._slow,
        )

    def _dialed_session(
        self, transport: Transport, *, token: bytes | None, request_timeout: float
    ) -> PeerConnection:
        """A session with the durable peer over a transport this node dialed."""
        return self._session(
            transport,
            dialed=True,
            token=token,
            on_update=self._upstream.on_update,
            request_timeout=request_timeout,
        )

    def _slow(self, label: str) -> Slow:
        """Progress for sync work that may take long (see ``Node.open``'s ``progress``)."""
        return Slow(label, lambda: self._received, log=log, bar=self._progress)

    def _check_open(self) -> None:
        """Raise NodeClosed once :meth:`close` was called."""
        if self._closed:
            raise NodeClosed("this node is closed: open the store again with Node.open()")

    def _entropy(self, size: int) -> bytes:
        """``size`` random bytes (from the injected ``rng`` if the node was given one)."""
        return secrets.token_bytes(size) if self._rng is None else self._rng.randbytes(size)

    def _notify(self, changes: list[EntityChange]) -> None:
        """Tell the live queries, the served subscriptions and every listener (the
        applier calls this after each write, in commit order)."""
        if not changes:
            return
        self._received += len(changes)
        self._reactor.on_change(changes)
        self._responder.on_change(changes)
        for listener in list(self._listeners):
            try:
                listener(changes)
            except Exception:  # a broken listener must not break commits
                log.exception("a change listener failed")

    async def _commit_remote(self, commits: list[list[Event]], check: EventCheck) -> IngestResult:
        """Commit a peer's commits in order, in one write (each all-or-nothing, checked
        before anything is durable), with other peers' that arrive meanwhile
        (:mod:`mycelia.node.combining`)."""
        return await self._combiner.commit(commits, check)

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        """Run ``coro`` as a task the node keeps (errors are logged, not lost)."""
        task = asyncio.ensure_future(coro)
        self._tasks[task] = None
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("a node task failed", exc_info=task.exception())
