"""The link: a node's current session with its durable peer, and the one definition of
connection state (ARCHITECTURE.md §7).

:class:`ConnectionState` says where a node stands with its durable peer. :class:`Link`
holds that state, the open session, and why the last attempt failed. The upstream
(:mod:`mycelia.node.upstream`) talks to the peer only through the link, and a
:class:`~mycelia.node.client.Connection` shows the state it holds.

Invariants:

- CLOSED is final: only :meth:`Link.reopen` (a new ``connect``) leaves it.
- A link the peer refused for good is CLOSED with the refusal kept, and every wait
  raises it.
- Every change of state wakes the waiters (:meth:`Link.wait_state`).
- A request with no open session raises :class:`~mycelia.errors.NotConnected`.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Sequence
from typing import TypeVar

from mycelia.errors import (
    ConnectionClosed,
    MyceliaError,
    NotConnected,
    ProtocolError,
    RequestTimeout,
)
from mycelia.node.ports import MakeRequest, Session
from mycelia.proto import AdmittedEvent, EventId
from mycelia.proto.messages import Message
from mycelia.proto.peering import EventsResponse, GetEventsRequest

__all__ = ["ConnectionState", "Link"]

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)


class ConnectionState(enum.Enum):
    """Where a node stands with its durable peer."""

    CONNECTING = "connecting"
    """Dialing, in the handshake, or preparing the session."""
    READY = "ready"
    """Connected, system joined, owed commits pushed, subscriptions re-established."""
    DISCONNECTED = "disconnected"
    """Between attempts (the last error is in :attr:`Link.error`)."""
    CLOSED = "closed"


class Link:
    """The current session with the durable peer and the connection state (one place).

    ``error`` is why the last session ended or the last attempt failed. A link that the
    peer refused for good (:meth:`refuse`: a policy or token refusal, another system) is
    CLOSED with that refusal in ``refusal``, and every wait raises it.
    """

    def __init__(self) -> None:
        self.state = ConnectionState.CONNECTING  # a link exists to be connected
        self.error: BaseException | None = None
        self.refusal: MyceliaError | None = None
        """Why the peer will never take this node, once it said so (the link is CLOSED)."""
        self.session: Session | None = None
        """The open session (handshake done), READY or still being prepared."""
        self._changed = asyncio.Condition()

    @property
    def ready(self) -> bool:
        """Whether the durable peer is connected and the session prepared."""
        return self.state is ConnectionState.READY

    async def set_state(self, state: ConnectionState) -> None:
        """Move to ``state`` (CLOSED is final) and wake the waiters."""
        async with self._changed:
            if self.state is not ConnectionState.CLOSED:
                self.state = state
            self._changed.notify_all()

    async def let_go(self) -> None:
        """The session ended: the link leaves READY as the session is let go, in one step.
        (Cleared while still READY, a read in between answered from here and said the
        durable peer had been asked, and ``wait_ready`` returned with no session.)"""
        if self.state is ConnectionState.READY:
            self.state = ConnectionState.DISCONNECTED
        self.session = None
        async with self._changed:
            self._changed.notify_all()

    async def refuse(self, refusal: MyceliaError) -> None:
        """The peer refused this node for good: CLOSED, and every wait raises ``refusal``."""
        self.error = self.refusal = refusal
        await self.set_state(ConnectionState.CLOSED)

    def reopen(self) -> None:
        """Make a CLOSED link usable by a new connection (``connect`` again, e.g. with a
        new token after a refusal)."""
        if self.state is ConnectionState.CLOSED:
            self.state = ConnectionState.CONNECTING
            self.error = self.refusal = None

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until READY; raises TimeoutError after ``timeout``, the refusal if the peer
        refused this node, ConnectionClosed if the link is closed first."""
        await self.wait_state(ConnectionState.READY, timeout, closed_raises=True)

    async def wait_state(
        self, state: ConnectionState, timeout: float | None = None, *, closed_raises: bool = False
    ) -> None:
        """Wait until the link is in ``state``; raises as :meth:`wait_ready` does."""

        def reached() -> bool:
            return self.state is state or self.state is ConnectionState.CLOSED

        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(reached)
        if self.state is not state and (closed_raises or state is not ConnectionState.CLOSED):
            if self.refusal is not None:
                raise self.refusal
            raise ConnectionClosed("the connection to the durable peer was closed")

    async def request(
        self, make: MakeRequest, *, expect: type[M], timeout: float | None = None
    ) -> M:
        """A request over the open session; raises ConnectionClosed when there is none."""
        session = self.session
        if session is None:
            raise NotConnected("not connected to the durable peer")
        return await session.request(make, expect=expect, timeout=timeout)

    async def get_events(self, ids: Sequence[EventId], ahead: int) -> list[AdmittedEvent]:
        """History from the durable peer (nothing when it is unreachable or refuses): the
        applier's remote source (ARCHITECTURE.md §4, the cached getter)."""
        wanted = tuple(ids)
        try:
            response = await self.request(
                lambda rid: GetEventsRequest(rid, wanted, ahead), expect=EventsResponse
            )
        except (ConnectionClosed, RequestTimeout, ProtocolError) as exc:
            log.info("could not fetch %d events from the durable peer: %s", len(wanted), exc)
            return []
        if len(response.generations) != len(response.events):
            return []
        pairs = zip(response.events, response.generations, strict=True)
        return [AdmittedEvent(e, g) for e, g in pairs]
