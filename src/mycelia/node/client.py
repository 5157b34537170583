"""Connections: a node dials its durable peer and keeps a session with it (ARCHITECTURE.md §7).

:func:`connect` returns a :class:`Connection`. A connection only dials, redials with
backoff until it is closed, and carries requests; each session it opens is a
:class:`~mycelia.node.peer.PeerConnection` over a fresh transport, which the node's
upstream prepares (system joined, owed commits pushed, subscriptions re-established)
before the link turns READY. The state itself lives in the node's
:class:`~mycelia.node.link.Link`, the one place that defines it; a connection shows it:

- :attr:`Connection.state`: CONNECTING (dialing, in the handshake, or preparing the
  session), READY, DISCONNECTED (between attempts), CLOSED (closed, or refused for good);
- :attr:`Connection.error`: why the last attempt failed or the last session ended;
- :meth:`Connection.wait_ready` / :meth:`Connection.wait_state`: wait for a state. A
  timeout raises :class:`~mycelia.errors.ConnectTimeout`, which names the state and the
  last cause in words (connection refused, DNS, TLS, protocol version, handshake).

A refusal that retrying cannot cure ends the redialing: the durable peer's policy
refused this node's token (:class:`~mycelia.errors.PolicyDenied`), or the peer belongs to
another system (:class:`~mycelia.errors.ForeignSystem`). The connection is then CLOSED and
every wait raises that refusal; ``connect`` again (with a new token) to retry. Any other
failure is retried with backoff, forever, until :meth:`Connection.close`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import socket
import ssl as ssl_module
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import InvalidHandshake, InvalidStatus

from mycelia.errors import (
    ConnectionClosed,
    ConnectTimeout,
    ForeignSystem,
    InvalidArgument,
    MyceliaError,
    PolicyDenied,
    PresenceRejected,
    RequestTimeout,
)
from mycelia.node.failover import Failover
from mycelia.node.link import ConnectionState, Link
from mycelia.node.peer import PeerConnection
from mycelia.node.ports import MakeRequest, Session
from mycelia.node.progress import Slow
from mycelia.node.tasks import stop
from mycelia.node.transport import Transport, WebsocketTransport
from mycelia.proto import Limits
from mycelia.proto.messages import Message

__all__ = ["Connection", "ConnectionState", "Dialer", "connect", "describe_failure"]

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
        slow: Callable[[str], Slow] | None = None,
    ) -> None:
        self._dial = dial
        self._slow = slow
        self._link = link
        self._open_session = open_session
        self._prepare = prepare
        self._finish = finish
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._rng = rng
        self._task: asyncio.Task[None] | None = None
        self._retired = False

    @property
    def state(self) -> ConnectionState:
        """What the connection is doing now: CONNECTING, READY, DISCONNECTED (between
        attempts) or CLOSED (closed, or refused for good: see :attr:`error`)."""
        return self._link.state

    @property
    def error(self) -> BaseException | None:
        """Why the last session ended or the last attempt failed (``None`` before any):
        the exception as raised (``OSError`` for a refused connection or DNS,
        ``ssl.SSLError`` for TLS, a :class:`~mycelia.errors.MyceliaError` otherwise);
        :func:`describe_failure` puts it in words. After a refusal for good it is the
        :class:`~mycelia.errors.PolicyDenied` or :class:`~mycelia.errors.ForeignSystem`
        that waits raise."""
        return self._link.error

    def start(self) -> None:
        """Start dialing (``connect`` does this)."""
        self._task = asyncio.ensure_future(self._loop())

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until READY.

        Raises:
            ConnectTimeout: not READY after ``timeout`` seconds (also a TimeoutError); the
                message names the state and the last cause. The connection keeps trying.
            PolicyDenied: the durable peer refused this node's credentials (for good).
            ForeignSystem: the durable peer belongs to another system (for good).
            ConnectionClosed: the connection was closed first.
        """
        await self.wait_state(ConnectionState.READY, timeout)

    async def wait_state(self, state: ConnectionState, timeout: float | None = None) -> None:
        """Wait until the connection is in ``state``; raises as :meth:`wait_ready` does
        (waiting for CLOSED raises nothing once closed, and no refusal)."""
        try:
            await self._link.wait_state(
                state, timeout, closed_raises=state is not ConnectionState.CLOSED
            )
        except TimeoutError as exc:
            if isinstance(exc, MyceliaError):
                raise
            now, cause = self._link.state, self._link.error
            raise ConnectTimeout(
                f"the durable peer is not {state.value} after {timeout:g} s: "
                f"{_standing(now, cause)}",
                state=now.value,
                cause=cause,
            ) from cause

    async def request(
        self, make: MakeRequest, *, expect: type[M], timeout: float | None = None
    ) -> M:
        """A request to the durable peer; raises ConnectionClosed when not connected."""
        return await self._link.request(make, expect=expect, timeout=timeout)

    def retire(self) -> None:
        """This CLOSED connection's node was connected again: its :meth:`close` no longer
        touches the node's link (``Node.attach`` calls this)."""
        self._retired = True

    async def close(self) -> None:
        """Stop redialing, close the session and wait for its work to end (confirmed
        commits settled)."""
        if self._retired:
            return
        await self._link.set_state(ConnectionState.CLOSED)
        session = self._link.session
        if self._task is not None:
            await stop(self._task)
        if session is not None:
            await session.close()
        await self._finish()

    async def _loop(self) -> None:
        link = self._link
        backoff = self._min_backoff
        told = ""  # the last cause logged at WARNING: a repeat is logged at INFO
        while link.state is not ConnectionState.CLOSED:
            await link.set_state(ConnectionState.CONNECTING)
            try:
                await self._session()
            except PresenceRejected as exc:
                refusal = refusal_for_good(exc)
                if refusal is not None:
                    log.warning(
                        "the durable peer refused this node for good, not retrying "
                        "(connect again to retry): %s: %s",
                        type(refusal).__name__,
                        refusal,
                    )
                    await link.refuse(refusal)
                    return
                link.error = exc
                told = _tell(told, "the durable peer refused this node", exc)
                backoff = self._max_backoff  # do not hammer a peer that refuses us
            except _Ended as ended:
                link.error = ended.error  # why a session that was ready ended
                log.info("the connection to the durable peer ended: %s", ended.error)
                told = ""
                backoff = self._min_backoff  # it was up: try again soon
            except (MyceliaError, OSError, TimeoutError) as exc:
                link.error = exc
                told = _tell(told, "could not connect to the durable peer", exc)
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
            if self._slow is None:
                await self._prepare(peer)
            else:  # a large first sync (many owed commits, queries to catch up) shows progress
                async with self._slow("syncing with the durable peer"):
                    await self._prepare(peer)
            await self._link.set_state(ConnectionState.READY)
            ready = True
            await peer.wait_closed()
        except (MyceliaError, OSError, TimeoutError) as exc:
            failure = exc  # the connection's own error, if it has one, says more
        finally:
            await self._link.let_go()
            await peer.close()
            await runner
        error = peer.error or failure or ConnectionClosed("the connection closed")
        if ready and not isinstance(error, PresenceRejected):
            raise _Ended(error)
        raise error


def describe_failure(error: BaseException | None) -> str:
    """Why a connection attempt failed, in words: connection refused, DNS, TLS, protocol
    version, handshake (the exception's own text follows in parentheses)."""
    if error is None:
        return "no attempt has failed yet"
    text = str(error) or type(error).__name__
    if isinstance(error, ConnectionRefusedError) or (
        isinstance(error, OSError) and "Connect call failed" in text
    ):
        return f"connection refused: nothing listens there (is the server running?) ({text})"
    if isinstance(error, socket.gaierror):
        return f"DNS: the host name could not be resolved ({text})"
    if isinstance(error, ssl_module.SSLCertVerificationError):
        return (
            f"TLS: the server's certificate is not trusted ({error.verify_message}); pass "
            f"ssl= with a context that trusts it"
        )
    if isinstance(error, ssl_module.SSLError):
        return f"TLS: the handshake failed; is it a TLS server (wss://)? ({text})"
    if isinstance(error, PresenceRejected) and "protocol" in text:
        return f"protocol version: the server speaks another version ({text})"
    if isinstance(error, PresenceRejected):
        return f"handshake: the server refused this node ({text})"
    if isinstance(error, RequestTimeout | TimeoutError):
        return f"handshake: the server did not answer in time ({text})"
    if isinstance(error, ConnectionClosed) and isinstance(error.__cause__, InvalidHandshake):
        return f"handshake: {text}"
    if isinstance(error, ConnectionResetError):
        return (
            f"network: the server reset the connection (wss:// to a server without TLS?) ({text})"
        )
    if isinstance(error, OSError):
        return f"network: {text}"
    return f"{type(error).__name__}: {text}"


def _standing(state: ConnectionState, cause: BaseException | None) -> str:
    """Where a connection stands, for a timeout's message."""
    if state is ConnectionState.CONNECTING and cause is None:
        return "still connecting, no attempt has failed yet (a slow handshake or session set-up)"
    where = {
        ConnectionState.CONNECTING: "connecting again",
        ConnectionState.DISCONNECTED: "disconnected, retrying",
        ConnectionState.READY: "ready",
        ConnectionState.CLOSED: "closed",
    }[state]
    return f"{where}; the last attempt failed: {describe_failure(cause)}"


_REFUSED = re.compile(
    r"rejected us: (?P<kind>\w+): (?P<text>.*) \(it speaks \d+, we sent \d+\)\Z", re.S
)


def refusal_for_good(rejected: PresenceRejected) -> MyceliaError | None:
    """The refusal that ``rejected`` carries if retrying cannot cure it: the peer's policy
    refused this node (``PolicyDenied: ...``, its reason in the PresenceRejected frame), or
    one side belongs to another system. ``None`` for anything else (a version mismatch, a
    proof that did not verify): those are retried."""
    text = str(rejected)
    told = _REFUSED.search(text)
    refusal: MyceliaError | None = None
    if told is not None and told["kind"] == "PolicyDenied":
        refusal = PolicyDenied(f"the durable peer refused this node: {told['text']}")
    elif "belongs to another system" in text:
        reason = told["text"] if told is not None else text
        refusal = ForeignSystem(
            f"the durable peer and this node belong to different systems ({reason}): "
            f"connect to a server of this node's system, or use a new store"
        )
    if refusal is not None:
        refusal.__cause__ = rejected
    return refusal


def _tell(told: str, what: str, error: BaseException) -> str:
    """Log a failed attempt: at WARNING when its cause is new, at INFO when it repeats."""
    cause = describe_failure(error)
    kind = cause.split(":", 1)[0]
    log.log(logging.INFO if kind == told else logging.WARNING, "%s: %s", what, cause)
    return kind


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
    against ``ssl`` (an ``ssl.SSLContext``) when given. ``request_timeout`` bounds the
    opening handshake and each request, and is how long the commit pipeline waits on a
    silent server for a commit's answer before it pushes its owed commits again on a new
    session (ARCHITECTURE.md §7). Raises InvalidArgument for a URL that is not a websocket
    URL, no URL, ``ssl`` with a ``ws://`` one, or a token that is not bytes.
    """
    urls = _checked_urls(url, ssl=ssl)
    dial_one = partial(
        _dial_websocket,
        limits=node.limits,
        compression=compression,
        request_timeout=request_timeout,
        ssl=ssl,
    )
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


def _checked_urls(url: str | Sequence[str], *, ssl: ssl_module.SSLContext | None) -> list[str]:
    """The server URLs ``connect`` was given, as a list; raises InvalidArgument for none,
    for one that is not a websocket URL, or for ``ssl`` with a ``ws://`` one."""
    urls = [url] if isinstance(url, str) else list(url)
    if not urls:
        raise InvalidArgument("give at least one server URL")
    for each in urls:
        parts = urlsplit(each)
        if parts.scheme not in ("ws", "wss") or not parts.hostname:
            scheme = f"scheme {parts.scheme + '://'!r}" if parts.scheme else "no scheme"
            raise InvalidArgument(
                f"{each!r} is not a websocket URL ({scheme}): use ws://host:port (or wss:// "
                "for TLS)"
            )
        if ssl is not None and parts.scheme != "wss":
            raise InvalidArgument(f"ssl= is given but {each!r} is not a wss:// URL")
    return urls


async def _dial_websocket(
    url: str,
    *,
    limits: Limits,
    compression: str | None,
    request_timeout: float,
    ssl: ssl_module.SSLContext | None,
) -> Transport:
    """Open a websocket to ``url`` (the handshake bounded by ``request_timeout``); a
    server that refuses it or is no websocket server raises ConnectionClosed."""
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
        if isinstance(exc.__cause__, EOFError):  # (not "not a Mycelia server": it may be one)
            raise ConnectionClosed(
                f"{url} closed the connection without answering the websocket handshake (a "
                "server that is stopping or at its connection limit does; so does a TLS "
                "server, which needs wss://)"
            ) from exc
        raise ConnectionClosed(
            f"{url} is not a Mycelia server ({exc}); a TLS server needs wss://"
        ) from exc
    return WebsocketTransport(websocket)
