"""What a peer connection is built from: the :class:`Identity` its node presents, the
handler its pushed updates go to, and the protocol session and byte budgets each new
:class:`~mycelia.node.peer.PeerConnection` starts with.

Invariants:

- A node has one :class:`Identity`, shared by all its connections: they present the same
  key and draw on the same answer pool (:mod:`mycelia.node.budget`).
- Each session presents the system root the node holds when the session is made (a node
  that joins a system later presents it from its next connection on), with a fresh
  handshake challenge from the node's entropy: none is read from a global (STYLE.md §3).
- A connection's outgoing queue and the peer's requests in flight are its own budgets;
  only the answer pool is shared.
- A connection's :class:`Committer` applies its commits in arrival order, one batch at a
  time, and is never cancelled: a batch begun is finished.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field

from mycelia.node.budget import Bounds, InFlight, Outgoing, Pool
from mycelia.node.identity import NodeKey
from mycelia.node.session import PeerSession, Pushed
from mycelia.proto import EntityId, Limits
from mycelia.proto.messages import Message
from mycelia.proto.peering import (
    CHALLENGE_LENGTH,
    CommitRequest,
    CommitsRequest,
    SubscriptionEnded,
)

__all__ = [
    "Committed",
    "Committer",
    "Identity",
    "UpdateHandler",
    "answer_size",
    "new_budgets",
    "new_session",
]

UpdateHandler = Callable[[Pushed | SubscriptionEnded], Coroutine[object, object, None] | None]
"""Takes a pushed update as it is read (an update still its frame: :class:`Pushed`); returns
the work to run on a task of the connection (``None``: work already running takes it)."""


@dataclass(frozen=True, slots=True)
class Identity:
    """What a connection presents of this node."""

    key: NodeKey
    durable: bool
    limits: Limits
    system_root: Callable[[], EntityId | None]
    entropy: Callable[[int], bytes]
    """The node's entropy (handshake challenges)."""
    answers: Pool = field(default_factory=Pool)
    """The node's answer pool, shared by its connections (:mod:`mycelia.node.budget`)."""


def new_session(me: Identity, *, token: bytes | None, dialed: bool) -> PeerSession:
    """The protocol session a connection drives: it presents ``me`` (with a fresh
    handshake challenge) and puts ``token`` in its proof."""
    return PeerSession(
        key=me.key,
        durable=me.durable,
        system_root=me.system_root(),
        limits=me.limits,
        token=token,
        challenge=me.entropy(CHALLENGE_LENGTH),
        dialer=dialed,
    )


def new_budgets(bounds: Bounds, answers: Pool, outgoing_frames: int) -> tuple[Outgoing, InFlight]:
    """A connection's two byte budgets (:mod:`mycelia.node.budget`): its outgoing queue,
    which draws on the node's answer pool, and the peer's requests in flight here."""
    outgoing = Outgoing(bounds.outgoing_bytes, answers, max_frames=outgoing_frames)
    return outgoing, InFlight(count=bounds.requests_in_flight, size=bounds.incoming_bytes)


def answer_size(msg: Message) -> int:
    """An upper bound of ``msg``'s encoded size (its deltas' or events' bytes, plus room)."""
    size = 1024
    for delta in getattr(msg, "deltas", ()):
        size += delta.wire_size()
    for event in getattr(msg, "events", ()):
        size += len(event.to_bytes()) + 16
    return size + len(getattr(msg, "text", "")) * 4


Committed = list[tuple[CommitRequest | CommitsRequest, int]]
"""A batch of a peer's commit requests, each with its size in bytes."""


class Committer:
    """A connection's commits: applied (by ``apply``) in arrival order, everything waiting
    at once, in one task that is never cancelled (:meth:`run`): it finishes a batch begun,
    and its answers go out while the connection lasts, in its own steps (no task and no
    shield per batch). ``answering`` holds a future per batch being applied (what a
    draining server waits for)."""

    def __init__(
        self, apply: Callable[[Committed], Awaitable[None]], answering: set[asyncio.Future[None]]
    ) -> None:
        self._apply = apply
        self._answering = answering
        self._waiting: Committed = []
        self._wake = asyncio.Event()
        self._stopped = False

    def add(self, request: CommitRequest | CommitsRequest, size: int) -> None:
        """Queue a commit request for the next batch."""
        self._waiting.append((request, size))
        self._wake.set()

    def stop(self) -> None:
        """Stop after the batch being applied (those still queued are not begun)."""
        self._stopped = True
        self._wake.set()

    async def run(self) -> None:
        """Apply batches until stopped."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._stopped:
                return
            batch, self._waiting = self._waiting, []
            if not batch:
                continue
            applying = asyncio.get_running_loop().create_future()
            self._answering.add(applying)
            try:
                await self._apply(batch)
            finally:
                self._answering.discard(applying)
                applying.set_result(None)
