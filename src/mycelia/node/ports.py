"""Ports: what each part of :mod:`mycelia.node` needs from the others (STYLE.md §3).

Each Protocol here is owned by its consumer and holds only what that consumer calls. The
composition root (:class:`~mycelia.node.Node`) wires an implementation to each; no part
is typed against ``Node`` or reaches through another part's attributes, and the
import-linter contract "Inside mycelia.node" (pyproject.toml) keeps the modules in one
order, so the circle of imports cannot come back.

========================  ===========================  =================================
port                      consumer                     implemented by
========================  ===========================  =================================
:class:`Peer`             the responder                ``PeerConnection``
:class:`Answers`          ``PeerConnection``           ``Responder``
:class:`Gate`             ``PeerConnection``           ``policy.Gatekeeper``
:class:`Session`          the upstream and its commits ``PeerConnection``
:class:`Watch`            ``LiveQuery``                ``reactor.Reactor``
:class:`Follow`           ``LiveQuery``                ``Upstream``
:class:`Reads`            ``Context``, ``Transaction`` ``Upstream``
:class:`Commits`          ``Transaction``              ``Upstream``
========================  ===========================  =================================
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Collection, Coroutine, Mapping, Sequence
from typing import Protocol, TypeVar

from mycelia.entity import Entity, EntityChange, EventCheck, ForkBase
from mycelia.node.policy import Credentials, PeerInfo
from mycelia.proto import EntityId, Event
from mycelia.proto.messages import Message
from mycelia.proto.peering import CommitRequest, CommitsRequest
from mycelia.proto.query import Query
from mycelia.retrieval import StoredState

__all__ = [
    "Answers",
    "Commit",
    "Commits",
    "Follow",
    "Gate",
    "MakeRequest",
    "Peer",
    "Reads",
    "Session",
    "Standing",
    "Watch",
]

M = TypeVar("M", bound=Message)

MakeRequest = Callable[[int], Message]
"""Builds a request from the request id the connection picked."""


class Peer(Protocol):
    """What the responder needs of one connected peer."""

    @property
    def credentials(self) -> Credentials:
        """What the peer proved at the handshake."""
        ...

    @property
    def remote(self) -> str:
        """Who the peer is, for logs."""
        ...

    @property
    def page_bytes(self) -> int:
        """How much one page of a paged answer to this peer aims to carry."""
        ...

    def push(self, msg: Message) -> None:
        """Send ``msg`` without waiting (a peer too slow to take it is cut off)."""
        ...

    async def send(self, msg: Message, *, size: int) -> None:
        """Send ``msg`` (at most ``size`` bytes encoded) once there is room for it; raises
        ConnectionClosed if the peer is gone or was cut off for not reading."""
        ...

    def check_credentials(self) -> None:
        """Raise PolicyDenied if the peer's credentials no longer admit it (expired)."""
        ...

    def cut_off(self, why: str) -> None:
        """Disconnect a peer that does not keep up (Overloaded, memory stays bounded)."""
        ...

    @property
    def closed(self) -> bool:
        """Whether the connection closed or is closing (the responder then forgets it)."""
        ...

    def spawn(self, coro: Coroutine[object, object, None]) -> None:
        """Run ``coro`` as long as the connection lives (not at all once it is closing)."""
        ...

    async def close(self) -> None:
        """Close the connection."""
        ...


class Answers(Protocol):
    """How a peer connection answers its peer (the node's responder)."""

    async def handle(self, peer: Peer, msg: Message) -> Message | None:
        """The response to one request (raise a MyceliaError to answer with an error;
        ``None``: it was sent already, see :meth:`Peer.send`)."""
        ...

    async def commit(
        self, peer: Peer, requests: Sequence[CommitRequest | CommitsRequest]
    ) -> list[Message]:
        """The responses to commit requests that arrived in this order, applied in this
        order."""
        ...

    def forget(self, peer: Peer) -> None:
        """Drop everything held for a closed connection."""
        ...


class Gate(Protocol):
    """How a peer connection decides about a peer whose key it has verified."""

    def admit(self, peer: PeerInfo, credentials: Credentials, system_root: EntityId | None) -> bool:
        """Whether the peer counts as durable; raise PolicyDenied or PresenceRejected to
        refuse it (``system_root`` is the one its Presence names)."""
        ...


class Session(Protocol):
    """What the upstream needs of one live session with its durable peer."""

    async def request(
        self, make: MakeRequest, *, expect: type[M], timeout: float | None = None
    ) -> M:
        """Send a request and wait for its response, which must be an ``expect``
        (RemoteProtocolError otherwise; RemoteError for a refusal)."""
        ...

    def submit(self, make: MakeRequest) -> asyncio.Future[Message]:
        """Send a request now; its response (or error) arrives in the future."""
        ...

    def stream(self, make: MakeRequest, *, timeout: float | None = None) -> Streaming:
        """Send a request; within the block, iterate its answer's pages as they arrive, then
        its final response (raises what :meth:`request` raises; the timeout is for each
        wait). Leaving the block cancels the request."""
        ...

    async def wait_closed(self) -> None:
        """Wait until the session has ended."""
        ...

    @property
    def frames_read(self) -> int:
        """Frames read from the peer so far (while it grows, the peer is alive and working)."""
        ...

    request_timeout: float
    """How long a request waits for its answer (``connect(..., request_timeout=...)``)."""

    async def close(self) -> None:
        """End the session."""
        ...


class Streaming(Protocol):
    """A request's answer taken as it arrives (:meth:`Session.stream`): ``async with`` it
    to iterate the pages, then the final response."""

    async def __aenter__(self) -> AsyncIterator[Message]: ...

    async def __aexit__(self, *exc: object) -> None: ...

    def responded(self) -> bool:
        """Whether its final response (or its failure) has arrived from the peer, however
        much of the answer has been taken."""
        ...


class Standing(Protocol):
    """A live query, as the reactor routes changes to it and the upstream mirrors it."""

    @property
    def query_id(self) -> int:
        """Its id on this node (and on the durable peer, which mirrors it)."""
        ...

    @property
    def collection(self) -> str:
        """The collection it reads."""
        ...

    @property
    def query(self) -> Query:
        """The bound query."""
        ...

    @property
    def text(self) -> str:
        """The query as written (sent to the durable peer with :attr:`args`)."""
        ...

    @property
    def args(self) -> tuple[object, ...]:
        """The query's arguments."""
        ...

    def member_ids(self) -> list[EntityId]:
        """The entities in its result now."""
        ...

    def apply(self, changes: list[EntityChange], views: dict[object, object]) -> None:
        """React to committed changes (``views`` shares views between queries)."""
        ...

    def kept_changed(self, gained: Collection[EntityId], lost: Collection[EntityId]) -> None:
        """The durable peer keeps ``gained`` current for it now and ``lost`` no longer (the
        deltas that said so are applied; see :mod:`mycelia.node.kept`)."""
        ...


class Watch(Protocol):
    """What a live query needs of the node's candidate index (the reactor)."""

    def add(self, live: Standing) -> None:
        """Start routing changes to ``live``."""
        ...

    def remove(self, live: Standing) -> None:
        """Stop routing changes to ``live``."""
        ...

    def reindex(self, live: Standing) -> None:
        """``live``'s query changed: route by the new one."""
        ...

    def track(self, entity_id: EntityId, live: Standing) -> None:
        """``entity_id`` is a member of ``live``."""
        ...

    def untrack(self, entity_id: EntityId, live: Standing) -> None:
        """``entity_id`` left ``live``."""
        ...


class Follow(Protocol):
    """What a live query needs of the durable peer: mirroring itself there."""

    async def follow(self, live: Standing) -> None:
        """Mirror ``live`` on the durable peer now (if connected) and after every reconnect."""
        ...

    async def resubscribe(self, live: Standing) -> None:
        """Mirror ``live`` again now (its query changed); no-op when not connected."""
        ...

    async def unfollow(self, live: Standing) -> None:
        """Stop mirroring ``live`` (offline is fine: the peer forgets a closed link's)."""
        ...

    def kept(self, live: Standing) -> Collection[EntityId] | None:
        """The entities the durable peer keeps current for ``live`` (``None`` while it is
        not mirrored: offline, or its subscription not answered yet)."""
        ...


class Reads(Protocol):
    """What contexts and transactions read: entities and query rows, kept current by the
    durable peer where there is one (ARCHITECTURE.md §7, read-through)."""

    async def entity(self, entity_id: EntityId) -> Entity | None:
        """The entity as this node holds it, refreshed from the durable peer first unless
        it is held and kept current by a subscription (``None``: unknown here and there)."""
        ...

    async def rows(
        self, collection: str, query: Query, text: str, args: tuple[object, ...]
    ) -> list[StoredState]:
        """The stored rows matching ``query`` (``text`` and ``args`` bound), after asking
        the durable peer for what this node lacks."""
        ...

    def connected(self) -> bool:
        """Whether a durable peer is connected and ready (for error messages)."""
        ...


class Commit(Protocol):
    """One local commit, as its transaction waits for it."""

    def done(self) -> bool:
        """Whether the durable peer confirmed or refused it (or none is needed)."""
        ...

    async def confirmed(self) -> None:
        """Wait until the durable peer holds it; raises its refusal (or CommitReverted)."""
        ...

    async def settled(self) -> None:
        """Wait until it is confirmed, or until the durable peer is unreachable (it is then
        owed); raises a refusal."""
        ...


class Commits(Protocol):
    """What a transaction needs to commit."""

    def base(self, entity: Entity) -> ForkBase:
        """What a fork of ``entity`` taken now starts from."""
        ...

    async def commit(
        self, events: Sequence[Event], *, bases: Mapping[EntityId, ForkBase], check: EventCheck
    ) -> Commit:
        """Commit locally now (durable here, visible to reads and live queries) and, on an
        ephemeral node, owe it to the durable peer. Raises before anything is durable."""
        ...


ChangeListener = Callable[[list[EntityChange]], None]
"""Called synchronously after every commit that changed entities."""
