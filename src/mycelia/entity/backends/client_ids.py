"""Yrs client ids for text forks: leased, given back, never held by two live forks
(ARCHITECTURE.md §5 "Text"; :mod:`mycelia.entity.backends.text` uses them)."""

from __future__ import annotations

import random
from typing import Final

__all__ = ["REPLICA_CLIENT_ID", "ClientIds"]

REPLICA_CLIENT_ID: Final = 0
"""The Yrs client id of a replica document (it takes no local edits, so it mints no items;
:class:`ClientIds` only hands out odd ids, never this one)."""


class ClientIds:
    """Yrs client ids for forks (injectable for determinism), leased and given back.

    A Yrs document slows down with the number of client ids it has seen, so a node reuses
    ids: a transaction leases one for its forks and releases it once its edits are either
    published here (committed: the resident document holds every item made with it) or
    never will be (rolled back). Two live forks never share an id.
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        # ids, not secrets; without an injected rng, one seeded from the OS (the caller's
        # choice: a node passes its own entropy when it has been given one).
        self._rng = rng or random.Random()
        self._free: list[int] = []

    def next(self) -> int:
        """A client id no live fork holds: a released one, or a fresh random one."""
        if self._free:
            return self._free.pop()
        return self._rng.getrandbits(52) | 1

    def claim(self, client_id: int) -> bool:
        """Lease ``client_id`` itself if it is free (released, not held by a live fork)."""
        try:
            self._free.remove(client_id)
        except ValueError:
            return False
        return True

    def release(self, client_id: int) -> None:
        """Give back an id whose fork's edits are all published here, or discarded.

        A replica's id (:data:`REPLICA_CLIENT_ID`) was never leased and is ignored.
        """
        if client_id != REPLICA_CLIENT_ID and client_id not in self._free:
            self._free.append(client_id)
