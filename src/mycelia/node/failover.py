"""Failover: one client, several servers of one cluster (ARCHITECTURE.md §7).

Servers on one PostgreSQL are interchangeable replicas: each holds every commit (each
follows the store's change feed), so a client may talk to any of them.
:class:`Failover` is a :data:`~mycelia.node.client.Dialer` over several URLs, which a
:class:`~mycelia.node.client.Connection` calls once per attempt. Invariants:

- One call tries the servers **in turn**, each at most once, starting with the one after
  the server last connected to (a new call means that session ended, or its handshake
  failed: its server may be the one that died), and returns the first transport that
  opens. If none opens it raises :class:`~mycelia.errors.ConnectionClosed` naming each
  failure, and the connection waits its back-off (doubling, with jitter) before the next
  round; a session that was ready and ended is redialed after the shortest back-off.
- Nothing else changes on failover: the connection prepares every session the same way
  (owed and in-flight commits pushed again, live queries re-subscribed with the heads
  held here, so they catch up), and events are deduplicated by id, so a commit that the
  dead server made durable before its answer was lost is simply acknowledged again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from mycelia.errors import ConnectionClosed, InvalidArgument, MyceliaError
from mycelia.node.transport import Transport

__all__ = ["Failover"]

log = logging.getLogger(__name__)


class Failover:
    """Dials the first of several servers that answers, in turn (see the module)."""

    def __init__(self, urls: Sequence[str], dial: Callable[[str], Awaitable[Transport]]) -> None:
        if not urls:
            raise InvalidArgument("give at least one server URL")
        self.urls = tuple(urls)
        self._dial = dial
        self._next = 0
        self.current: str | None = None
        """The server of the last transport opened (``None`` before the first)."""

    def order(self) -> list[str]:
        """The servers the next call tries, in order."""
        n = len(self.urls)
        return [self.urls[(self._next + i) % n] for i in range(n)]

    async def __call__(self) -> Transport:
        """A transport to the first server in :meth:`order` that opens one."""
        failures = []
        for url in self.order():
            try:
                transport = await self._dial(url)
            except (MyceliaError, OSError, TimeoutError) as exc:
                failures.append(f"{url}: {exc}")
                log.info("server %s did not answer (%s); trying the next", url, exc)
                continue
            if self.current is not None and url != self.current:
                log.info("failed over from %s to %s", self.current, url)
            self.current = url
            self._next = (self.urls.index(url) + 1) % len(self.urls)
            return transport
        raise ConnectionClosed("no server answered: " + "; ".join(failures))
