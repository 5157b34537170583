"""Connections: a node dials its durable peer and keeps a session with it (ARCHITECTURE.md §7).

:func:`connect` returns a :class:`Connection`. A connection only dials, redials with
backoff until it is closed, and carries requests; each session it opens is a
:class:`~mycelia.node.peer.PeerConnection` over a fresh transport, which the node's
upstream prepares (system joined, owed commits pushed, subscriptions re-established)
before the link turns READY. The state itself lives in the node's
:class:`~mycelia.node.upstream.Link`, the one place that defines it; a connection shows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl as ssl_module
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import InvalidHandshake, InvalidStatus

from mycelia.errors import (
    ConnectionClosed,
    InvalidArgument,
    MyceliaError,
    PresenceRejected,
)
from mycelia.node.failover import Failover
from mycelia.node.peer import PeerConnection
from mycelia.node.ports import MakeRequest, Session
from mycelia.node.transport import Transport, WebsocketTransport
from mycelia.node.upstream import ConnectionState, Link
from mycelia.proto import Limits
from mycelia.proto.messages import Message

__all__ = ["Connection", "ConnectionState", "Dialer", "connect"]

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)

Dialer = Callable[[], Awaitable[Transport]]
"""Opens a fresh transport to the durable peer (raises OSError or a MyceliaError)."""


class Connection:
    """A node's link to its durable peer; redials until :meth:`close` (see the module)."""

    def __init__(
        self,
        dial: Dialer,
        *,
        link: Link,
        open_session: Callable[[Transport], PeerConnection],
        prepare: Callable[[Session], Awaitable[None]],
        finish: Callable[[], Awaitable[None]],
        min_backoff: float,
        max_backoff: float,
        rng: random.Random,
    ) -> None:
        self._dial = dial
        self._link = link
        self._open_session = open_session
        self._prepare = prepare
        self._finish = finish
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._rng = rng
        self._task: asyncio.Task[None] | None = None

    @property
    def state(self) -> ConnectionState:
        """What the connection is doing now (see :class:`ConnectionState`)."""
        return self._link.state

    @property
    def error(self) -> BaseException | None:
        """Why the last session ended or the last attempt failed (``None`` before any)."""
        return self._link.error

    def start(self) -> None:
        """Start dialing (``connect`` does this)."""
        self._task = asyncio.ensure_future(self._loop())

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until READY; TimeoutError after ``timeout``, ConnectionClosed once closed."""
        await self._link.wait_ready(timeout)

    async def wait_state(self, state: ConnectionState, timeout: float | None = None) -> None:
        """Wait until the connection is in ``state`` (TimeoutError after ``timeout``)."""
        await self._link.wait_state(state, timeout)

    async def request(
        self, make: MakeRequest, *, expect: type[M], timeout: float | None = None
    ) -> M:
        """A request to the durable peer; raises ConnectionClosed when not connected."""
        return await self._link.request(make, expect=expect, timeout=timeout)

    async def close(self) -> None:
        """Stop redialing, close the session and wait for its work to end (confirmed
        commits settled)."""
        await self._link.set_state(ConnectionState.CLOSED)
        session = self._link.session
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if session is not None:
            await session.close()
        await self._finish()

    async def _loop(self) -> None:
        link = self._link
        backoff = self._min_backoff
        while link.state is not ConnectionState.CLOSED:
            await link.set_state(ConnectionState.CONNECTING)
            try:
                await self._session()
            except PresenceRejected as exc:
                link.error = exc
                log.warning("the durable peer refused this node: %s", exc)
                backoff = self._max_backoff  # do not hammer a peer that refuses us
            except _Ended as ended:
                link.error = ended.error  # why a session that was ready ended
                log.info("the connection to the durable peer ended: %s", ended.error)
                backoff = self._min_backoff  # it was up: try again soon
            except (MyceliaError, OSError, TimeoutError) as exc:
                link.error = exc
                log.info("connection to the durable peer failed: %s", exc)
            await link.set_state(ConnectionState.DISCONNECTED)
            await asyncio.sleep(backoff * (0.5 + self._rng.random()))  # reconnect backoff
            backoff = min(backoff * 2, self._max_backoff)

    async def _session(self) -> None:
        """One session: raises why it could not start, or _Ended (with why it ended) once
        it was READY."""
        peer = self._open_session(await self._dial())
        runner = asyncio.ensure_future(peer.run())
        ready = False
        failure: BaseException | None = None
        try:
            await peer.wait_ready()
            if not peer.peer_durable:
                raise PresenceRejected("the peer this node dialed is not a durable node")
            self._link.session = peer
            await self._prepare(peer)
            await self._link.set_state(ConnectionState.READY)
            ready = True
            await peer.wait_closed()
        except (MyceliaError, OSError, TimeoutError) as exc:
            failure = exc  # the connection's own error, if it has one, says more
        finally:
            self._link.session = None
            await peer.close()
            await runner
        error = peer.error or failure or ConnectionClosed("the connection closed")
        if ready and not isinstance(error, PresenceRejected):
            raise _Ended(error)
        raise error


class _Ended(Exception):
    """A session that was ready ended; ``error`` says why (internal to the connect loop)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class Dialable(Protocol):
    """What :func:`connect` needs of a node."""

    @property
    def limits(self) -> Limits:
        """The node's decode limits (the largest frame it takes)."""
        ...

    def attach(
        self,
        dial: Dialer,
        *,
        token: bytes | None,
        min_backoff: float,
        max_backoff: float,
        request_timeout: float,
        rng: random.Random,
    ) -> Connection:
        """Use ``dial`` to reach the node's durable peer from now on."""
        ...


async def connect(
    node: Dialable,
    url: str | Sequence[str],
    *,
    token: bytes | None = None,
    min_backoff: float = 0.05,
    max_backoff: float = 5.0,
    request_timeout: float = 30.0,
    compression: str | None = None,
    ssl: ssl_module.SSLContext | None = None,
    rng: random.Random | None = None,
) -> Connection:
    """Dial ``url`` (``ws://host:port`` or ``wss://``) and keep the node connected until closed.

    ``url`` may be several servers of one cluster (replicas on one PostgreSQL): they are
    tried in turn, and when the one in use dies the node fails over to the next, with
    backoff (:mod:`mycelia.node.failover`); owed and in-flight commits are pushed again
    and live queries re-subscribed, as on any reconnect.

    Returns at once; ``await node.wait_ready(timeout=...)`` (or the connection's
    ``wait_ready``) waits for the first usable connection. ``compression="deflate"``
    turns on permessage-deflate (off by default: frames are already compact msgpack).
    ``wss://`` verifies the server's certificate against the system's trust store, or
    against ``ssl`` (an ``ssl.SSLContext``) when given. Raises InvalidArgument for a URL
    that is not a websocket URL, no URL, or ``ssl`` with a ``ws://`` one.
    """
    urls = [url] if isinstance(url, str) else list(url)
    if not urls:
        raise InvalidArgument("give at least one server URL")
    for each in urls:
        parts = urlsplit(each)
        if parts.scheme not in ("ws", "wss") or not parts.hostname:
            raise InvalidArgument(
                f"{each!r} is not a websocket URL: use ws://host:port (or wss:// for TLS)"
            )
        if ssl is not None and parts.scheme != "wss":
            raise InvalidArgument(f"ssl= is given but {each!r} is not a wss:// URL")
    limits = node.limits

    async def dial_one(url: str) -> Transport:
        tls: dict[str, Any] = {} if ssl is None else {"ssl": ssl}  # wss:// defaults to verify
        try:
            websocket = await ws_connect(
                url,
                max_size=limits.max_frame_bytes,
                compression=compression,
                open_timeout=request_timeout,
                ping_interval=20,
                close_timeout=2,
                **tls,
            )
        except InvalidStatus as exc:
            status = exc.response.status_code
            raise ConnectionClosed(f"{url} refused the websocket: HTTP {status}") from exc
        except InvalidHandshake as exc:
            raise ConnectionClosed(
                f"{url} is not a Mycelia server ({exc}); a TLS server needs wss://"
            ) from exc
        return WebsocketTransport(websocket)

    dial: Dialer = Failover(urls, dial_one) if len(urls) > 1 else partial(dial_one, urls[0])
    connection = node.attach(
        dial,
        token=token,
        min_backoff=min_backoff,
        max_backoff=max_backoff,
        request_timeout=request_timeout,
        rng=rng or random.Random(),
    )
    connection.start()
    return connection
