"""Client connections: a node dials a durable peer and keeps the link alive (ARCHITECTURE.md §7).

:func:`connect` returns a :class:`Connection` that reconnects with backoff until closed.
After every (re)connection, before it reports ready, it:

1. joins the server's system if this node has none (a node of another system is refused);
2. pushes the **outbox** — commits made while no durable peer was reachable, kept in
   storage as sealed event bytes — until the server confirms them (retries are harmless:
   events are deduplicated by id);
3. re-establishes every remote subscription, sending the heads it holds, so it catches up
   with bridges or snapshots and learns which entities left each query while it was away.

Pushed updates are applied through the normal applier path; events whose parents are
missing are fetched from the server (``GetEvents``) before anything is given up on.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

from websockets.asyncio.client import connect as ws_connect

from mycelia.entity import EntityChange, IngestResult
from mycelia.errors import (
    ConnectionClosed,
    MyceliaError,
    PresenceRejected,
    ProtocolError,
    RemoteError,
)
from mycelia.node.peer import PeerConnection
from mycelia.node.transport import Transport, WebsocketTransport
from mycelia.proto import Clock, EventId
from mycelia.proto.messages import Message
from mycelia.proto.peering import (
    CommitRequest,
    Delta,
    EventsResponse,
    GetEventsRequest,
    SubscriptionUpdate,
    SystemRequest,
)

if TYPE_CHECKING:
    from mycelia.node.node import Node

__all__ = ["Connection", "ConnectionState", "connect"]

log = logging.getLogger(__name__)

MAX_FETCH_ROUNDS: Final = 64
"""Rounds of asking the server for missing parents before events are left pending."""


class ConnectionState(enum.Enum):
    """What a :class:`Connection` is doing."""

    CONNECTING = "connecting"
    READY = "ready"
    """Connected, system joined, outbox pushed, subscriptions re-established."""
    DISCONNECTED = "disconnected"
    """Between attempts (the last error is in :attr:`Connection.error`)."""
    CLOSED = "closed"


Dialer = Callable[[], Awaitable[Transport]]
ReadyHook = Callable[["Connection"], Awaitable[None]]


class Connection:
    """A node's link to one durable peer; reconnects until :meth:`close`."""

    def __init__(
        self,
        node: Node,
        dial: Dialer,
        *,
        token: bytes | None,
        min_backoff: float,
        max_backoff: float,
        request_timeout: float,
        rng: random.Random,
    ) -> None:
        self.node = node
        self._dial = dial
        self._token = token
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._request_timeout = request_timeout
        self._rng = rng
        self.state = ConnectionState.CONNECTING
        self.error: BaseException | None = None
        self.peer: PeerConnection | None = None
        self._changed = asyncio.Condition()
        self._ready_hooks: list[ReadyHook] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the connect loop (``connect`` does this)."""
        self._task = asyncio.ensure_future(self._loop())

    def on_ready(self, hook: ReadyHook) -> Callable[[], None]:
        """Run ``hook`` after every (re)connection, before the state becomes READY."""
        self._ready_hooks.append(hook)
        return lambda: self._ready_hooks.remove(hook)

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until the connection is READY (raises TimeoutError after ``timeout``)."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(
                lambda: self.state in (ConnectionState.READY, ConnectionState.CLOSED)
            )
        if self.state is ConnectionState.CLOSED:
            raise ConnectionClosed("the connection was closed")

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Alias of :meth:`wait_ready`: a connection counts once it is usable."""
        await self.wait_ready(timeout)

    async def wait_state(self, state: ConnectionState, timeout: float | None = None) -> None:
        """Wait until the connection is in ``state``."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: self.state is state)

    async def request(
        self, make: Callable[[int], Message], *, timeout: float | None = None
    ) -> Message:
        """A request to the server; raises ConnectionClosed when not connected."""
        peer = self.peer
        if peer is None or not peer.ready:
            raise ConnectionClosed("not connected to the server")
        return await peer.request(make, timeout=timeout)

    async def close(self) -> None:
        """Stop reconnecting and close the link."""
        await self._set_state(ConnectionState.CLOSED)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.peer is not None:
            await self.peer.close()

    async def _set_state(self, state: ConnectionState) -> None:
        async with self._changed:
            if self.state is not ConnectionState.CLOSED:
                self.state = state
            self._changed.notify_all()

    async def _loop(self) -> None:
        backoff = self._min_backoff
        while self.state is not ConnectionState.CLOSED:
            await self._set_state(ConnectionState.CONNECTING)
            try:
                await self._session()
                backoff = self._min_backoff  # a session that got ready resets the backoff
            except PresenceRejected as exc:
                self.error = exc
                log.warning("the server refused this node: %s", exc)
                backoff = self._max_backoff  # do not hammer a server that refuses us
            except (MyceliaError, OSError, TimeoutError) as exc:
                self.error = exc
                log.info("connection failed: %s", exc)
            await self._set_state(ConnectionState.DISCONNECTED)
            await asyncio.sleep(backoff * (0.5 + self._rng.random()))  # reconnect backoff
            backoff = min(backoff * 2, self._max_backoff)

    async def _session(self) -> None:
        transport = await self._dial()
        peer = PeerConnection(
            self.node,
            transport,
            dialed=True,
            token=self._token,
            on_update=self._on_update,
            request_timeout=self._request_timeout,
        )
        self.peer = peer
        runner = asyncio.ensure_future(peer.run())
        try:
            await peer.wait_ready()
            await self._prepare(peer)
            await self._set_state(ConnectionState.READY)
            await peer.wait_closed()
        finally:
            await peer.close()
            await runner
            self.node.responder.forget(peer)
        if peer.error is not None and not isinstance(peer.error, ConnectionClosed):
            raise peer.error

    async def _prepare(self, peer: PeerConnection) -> None:
        if not peer.peer_durable:
            raise ProtocolError("the server is not a durable node")
        if self.node.system_root is None:
            response = await peer.request(SystemRequest)
            assert isinstance(response, EventsResponse)
            await self.node.join_system(response.events)
        await self.push_outbox()
        for hook in list(self._ready_hooks):
            await hook(self)

    async def push_outbox(self) -> None:
        """Send owed commits to the server until it confirms them."""
        owed = await self.node.outbox.pending()
        limit = self.node.limits.max_batch_events
        for start in range(0, len(owed), limit):
            batch = tuple(owed[start : start + limit])
            try:
                await self.request(lambda rid, b=batch: CommitRequest(rid, b))  # type: ignore[misc]
            except RemoteError as exc:
                # The server will never take these (policy, another system): keeping them
                # owed forever would block everything after them. Log and drop.
                log.error("the server refused %d owed events (%s): dropping them", len(batch), exc)
            await self.node.outbox.settle(e.id for e in batch)

    async def _on_update(self, peer: PeerConnection, update: SubscriptionUpdate) -> None:
        await self.apply_deltas(update.deltas)

    async def apply_deltas(self, deltas: tuple[Delta, ...]) -> list[EntityChange]:
        """Apply deltas from the server (states merged, events ingested, gaps fetched)."""
        changes: list[EntityChange] = []
        events = [e for d in deltas for e in d.events]
        states = [d.state for d in deltas if d.state is not None]
        # An ephemeral node trusts its durable peer's states, so also its word that a state
        # descends from the head held here; a durable node takes no head on a peer's word.
        bases = {
            d.entity_id: Clock(d.base)
            for d in deltas
            if d.state is not None and d.base is not None and not self.node.durable
        }
        if states:
            result = await self.node.applier.ingest_states(states, bases=bases)
            changes.extend(result.changes)
        if events:
            result = await self.node.applier.ingest(events)
            for entity_id, error in result.errors.items():
                log.warning("the server sent events for %s that were refused: %s", entity_id, error)
            changes.extend(result.changes)
            changes.extend(await self._fill_gaps(result))
        self.node.notify(changes)
        return changes

    async def _fill_gaps(self, result: IngestResult) -> list[EntityChange]:
        """Ask the server for parents nobody here has, until the held events apply."""
        changes: list[EntityChange] = []
        missing: set[EventId] = set(result.missing)
        for _ in range(MAX_FETCH_ROUNDS):
            if not missing:
                break
            ids = tuple(sorted(missing))
            response = await self.request(lambda rid, ids=ids: GetEventsRequest(rid, ids, 256))  # type: ignore[misc]
            assert isinstance(response, EventsResponse)
            if not response.events:
                break
            more = await self.node.applier.ingest(response.events)
            changes.extend(more.changes)
            missing = (missing | more.missing) - {e.id for e in more.stored}
            missing -= {e.id for e in response.events}
        return changes


async def connect(
    node: Node,
    url: str,
    *,
    token: bytes | None = None,
    min_backoff: float = 0.05,
    max_backoff: float = 5.0,
    request_timeout: float = 30.0,
    compression: str | None = None,
    rng: random.Random | None = None,
) -> Connection:
    """Dial ``url`` (``ws://host:port``) and keep the node connected until closed.

    Returns at once; ``await node.wait_ready()`` (or ``connection.wait_ready()``) waits
    for the first usable connection. ``compression="deflate"`` turns on
    permessage-deflate (off by default: frames are already compact msgpack).
    """

    async def dial() -> Transport:
        websocket = await ws_connect(
            url,
            max_size=node.limits.max_frame_bytes,
            compression=compression,
            open_timeout=request_timeout,
            ping_interval=20,
            close_timeout=2,
        )
        return WebsocketTransport(websocket)

    connection = Connection(
        node,
        dial,
        token=token,
        min_backoff=min_backoff,
        max_backoff=max_backoff,
        request_timeout=request_timeout,
        rng=rng or random.Random(),
    )
    node.attach_upstream(connection)
    connection.start()
    return connection
