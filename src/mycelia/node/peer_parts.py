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
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field

from mycelia.node.budget import Bounds, InFlight, Outgoing, Pool
from mycelia.node.identity import NodeKey
from mycelia.node.session import PeerSession, Pushed
from mycelia.proto import EntityId, Limits
from mycelia.proto.messages import Message
from mycelia.proto.peering import CHALLENGE_LENGTH, SubscriptionEnded

__all__ = ["Identity", "UpdateHandler", "answer_size", "new_budgets", "new_session"]

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
