"""The PostgreSQL change feed's wake-up: ``LISTEN`` on the feed's channel (ARCHITECTURE.md §6).

Every write batch with states notifies its last feed offset on commit, with the id of
the engine that wrote it and, when they fit, its feed rows
(:mod:`mycelia.storage.postgres_notice`). A :class:`FeedListener` keeps one connection
listening, turns notifications into wake-ups for :meth:`FeedListener.wait`, and keeps the
rows they told of (:attr:`FeedListener.heard`). Invariants:

- The wake is a **hint only**. A waiter asks the server for the clock whenever it could
  have missed a notification — while not listening, when it waits below the clock read
  as the connection started listening (:attr:`FeedListener.heard_from`: every offset above
  it notifies this connection), and every ``poll_interval`` seconds without a wake — so a
  lost notification (a dropped connection, a proxy or a PostgreSQL-compatible server
  without ``NOTIFY``) costs latency, never data. Otherwise it waits without a query: a
  node's follower then costs no query for its own commits.
- :attr:`FeedListener.notified` is the largest offset announced (by a notification, or by
  this engine's own write through :meth:`FeedListener.announce`). Offsets commit in order
  (the feed clock row serialises writers), so every offset up to it is committed: a waiter
  below it returns at once, without asking the server.
- An engine's own writes wake its waiters through :meth:`FeedListener.announce`, once the
  write has returned (and the engine has noted its feed rows), never through their
  notification, which may arrive first: it is ignored.
- A row in :attr:`FeedListener.heard` is committed (a notification is delivered on
  commit) and is the feed's row at its offset; rows not heard (a lost notification, a
  payload without them) are simply absent, so a reader uses heard rows only as a run
  with no gap and reads the rest.
- A lost listening connection is re-established with exponential back-off (from the poll
  interval up to :data:`MAX_BACKOFF`), logged once per loss; meanwhile waiters poll. Once
  listening again it wakes every waiter: something may have committed meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Final

import psycopg
from psycopg import sql

from mycelia.errors import StorageError
from mycelia.proto import AdmittedEvent
from mycelia.storage.engine import FeedEntry
from mycelia.storage.postgres_notice import parse_notice

__all__ = ["HEARD", "MAX_BACKOFF", "FeedListener"]

log = logging.getLogger(__name__)

MAX_BACKOFF: Final = 30.0
"""Longest pause between attempts to listen again (seconds)."""
HEARD: Final = 4096
"""Most feed rows kept from notifications."""


class FeedListener:
    """One ``LISTEN`` connection's wake-ups for feed waiters (see the module docstring)."""

    def __init__(
        self,
        dsn: str,
        channel: str,
        *,
        clock: Callable[[], Awaitable[int]],
        poll_interval: float,
        remember: Callable[[Sequence[AdmittedEvent]], None] = lambda _: None,
    ) -> None:
        """``clock`` reads the feed clock (the newest committed offset); ``remember`` keeps
        the stored events notifications tell of."""
        self.dsn = dsn
        self.channel = channel
        self.notified = 0
        self.pid: int | None = None
        """The backend process id of the listening connection (``None`` while not
        listening): operators and tests can find it in ``pg_stat_activity``."""
        self.heard_from: int | None = None
        """The feed clock read once this connection listened: every offset above it is
        notified to it (``None`` while not listening)."""
        self.heard: OrderedDict[int, FeedEntry] = OrderedDict()
        """The feed rows the latest notifications told of, and those this engine wrote
        (:meth:`keep`), by offset: at most :data:`HEARD`
        (:mod:`mycelia.storage.postgres_notice`)."""
        self._clock = clock
        self._remember = remember
        self.writer = secrets.token_hex(8)
        """The id this engine's writes sign their notifications with."""
        self._poll = poll_interval
        self._news = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self, *, timeout: float) -> None:
        """Start listening; returns once it listens (or after ``timeout``, then polling)."""
        listening = asyncio.Event()
        self._task = asyncio.create_task(self._listen(listening), name=self.channel)
        try:  # so that a commit made right after this returns wakes the waiters
            async with asyncio.timeout(timeout):
                await listening.wait()
        except TimeoutError:
            log.warning("feed listener on %s not ready; polling", self.channel)

    def announce(self, offset: int) -> None:
        """Offsets up to ``offset`` are committed (this engine's own write): wake waiters."""
        self.notified = max(self.notified, offset)
        self._wake()

    def keep(self, rows: Iterable[FeedEntry]) -> None:
        """Note committed feed rows (heard of, or written by this engine) in :attr:`heard`."""
        heard = self.heard
        for row in rows:
            heard[row.offset] = row
        while len(heard) > HEARD:
            heard.popitem(last=False)

    async def wait(self, offset: int, *, timeout: float) -> bool:
        """Wait for a committed offset beyond ``offset``, at most ``timeout`` seconds;
        returns whether there is one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        ask = not self._hears_beyond(offset)
        while True:
            news = self._news  # taken before reading, so a wake in between is not missed
            if self.notified > offset:
                return True
            if ask:
                last = await self._clock()
                if last > offset:
                    self.notified = max(self.notified, last)
                    return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                async with asyncio.timeout(min(remaining, self._poll)):
                    await news.wait()
            except TimeoutError:
                ask = True  # a poll interval without a wake: a notification may be lost
            else:
                ask = not self._hears_beyond(offset)

    def _hears_beyond(self, offset: int) -> bool:
        """Whether every commit beyond ``offset`` is notified to the listening connection."""
        return self.heard_from is not None and offset >= self.heard_from

    async def close(self) -> None:
        """Stop listening."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.pid = self.heard_from = None

    def _wake(self) -> None:
        news, self._news = self._news, asyncio.Event()
        news.set()

    async def _listen(self, listening: asyncio.Event) -> None:
        backoff = self._poll
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
                async with conn:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    # the clock, read once listening (through the engine, so this
                    # connection's activity stays LISTEN, as operators look for it)
                    last = await self._clock()
                    self.notified = max(self.notified, last)  # committed, all of it
                    self.heard_from = last
                    self.pid = conn.info.backend_pid
                    listening.set()
                    backoff = self._poll
                    self._wake()  # something may have committed while we were not listening
                    async for notification in conn.notifies():
                        self._heard(notification.payload)
            except (psycopg.Error, StorageError) as exc:
                log.warning(
                    "feed listener on %s failed (%s); polling every %gs until it is back",
                    self.channel, exc, self._poll,
                )  # fmt: skip
            self.pid = self.heard_from = None
            self._wake()  # waiters ask the server from now on
            await asyncio.sleep(backoff)  # a reconnect back-off, not a wait for a condition
            backoff = min(backoff * 2, MAX_BACKOFF)

    def _heard(self, payload: str) -> None:
        said = parse_notice(payload, own=self.writer)
        if said is not None:  # else not an offset: still a hint that something moved
            if said.events:
                self._remember(said.events)  # before the rows: a reader of them reads these
            self.keep(said.rows or ())  # own rows too: a reader may pass them first
            if said.writer == self.writer:
                return  # this engine's own write: announce() tells of it once it has returned
            self.notified = max(self.notified, said.last)
        self._wake()
