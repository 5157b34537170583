"""Policy agents: who may connect, read, create and write (ARCHITECTURE.md §9).

Every check runs **before anything is made durable**: a denial raises
:class:`~mycelia.errors.PolicyDenied` and the whole transaction or remote commit persists
nothing. Collections starting with ``_mycelia_`` are reserved: no context can write them,
whatever the agent says (the node enforces that itself).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from mycelia.entity import Snapshot
from mycelia.errors import PolicyDenied, PresenceRejected
from mycelia.proto import AdmittedEvent, EntityId, NodeId, is_reserved_collection

log = logging.getLogger(__name__)

__all__ = [
    "Credentials",
    "Gatekeeper",
    "NamesSubjects",
    "PeerInfo",
    "PermissiveAgent",
    "PolicyAgent",
    "check_not_reserved",
]


@dataclass(frozen=True, slots=True)
class Credentials:
    """Who a context acts as: an opaque token the agent understands (``None``: local)."""

    token: bytes | None = None
    subject: str | None = None
    """A name for logs (the agent may fill it in when it verifies the token)."""
    local: bool = False
    """True for the node's own application (``node.context()``), never for a peer."""


LOCAL = Credentials(local=True)


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """What the node knows about a peer when it decides whether to accept it."""

    node_id: NodeId
    claims_durable: bool
    dialed: bool
    """Whether this node dialed the peer (a client trusts the server it chose)."""


class PolicyAgent(Protocol):
    """The decisions a node delegates. Raise PolicyDenied to refuse."""

    def check_connect(self, peer: PeerInfo, credentials: Credentials) -> None:
        """May this peer connect with these credentials?"""
        ...

    def trusts_durable(self, peer: PeerInfo) -> bool:
        """May this peer be treated as durable (only asked for peers it did not dial)?"""
        ...

    def can_read(self, credentials: Credentials, snapshot: Snapshot) -> bool:
        """May these credentials see this entity (get, fetch, subscribe, every update)?"""
        ...

    def check_event(
        self,
        credentials: Credentials,
        before: Snapshot,
        after: Snapshot,
        event: AdmittedEvent,
    ) -> None:
        """May these credentials make this change (``before.exists`` is False: a create)?"""
        ...


@runtime_checkable
class NamesSubjects(Protocol):
    """An agent that can say who credentials belong to (the server logs it per connection)."""

    def subject(self, credentials: Credentials) -> str | None:
        """The name the credentials prove (``None``: anonymous or invalid)."""
        ...


class PermissiveAgent:
    """Allows everything (the default for local use). Reserved collections stay reserved.

    A peer that dials in with a token expects it to be checked: the first one is logged as
    a warning (once per agent), since nothing here checks it."""

    _told = False  # (a class default: a subclass need not call __init__)

    def check_connect(self, peer: PeerInfo, credentials: Credentials) -> None:
        """Everyone may connect (a token is not checked: see the class docstring)."""
        if credentials.token is not None and not peer.dialed and not self._told:
            self._told = True
            log.warning(
                "peer %s sent a token, but this node checks none: it is open, and every "
                "peer reads and writes everything. To require tokens, run `mycelia serve "
                "--auth tokens` (or give the node a TokenAgent as its policy)",
                peer.node_id,
            )

    def trusts_durable(self, peer: PeerInfo) -> bool:
        """Peers that dial in are never trusted as durable on their own word."""
        return False

    def can_read(self, credentials: Credentials, snapshot: Snapshot) -> bool:
        """Everything is readable."""
        return True

    def check_event(
        self,
        credentials: Credentials,
        before: Snapshot,
        after: Snapshot,
        event: AdmittedEvent,
    ) -> None:
        """Every write is allowed."""


class Gatekeeper:
    """Admits peers whose keys verified: the agent decides, "durable" is never taken on the
    peer's own word (ARCHITECTURE.md §7), and a peer of another system is refused."""

    def __init__(self, policy: PolicyAgent, system_root: Callable[[], EntityId | None]) -> None:
        self._policy = policy
        self._system_root = system_root

    def admit(self, peer: PeerInfo, credentials: Credentials, system_root: EntityId | None) -> bool:
        """Whether the peer counts as durable; raises PolicyDenied or PresenceRejected."""
        self._policy.check_connect(peer, credentials)
        mine = self._system_root()
        if mine is not None and system_root not in (None, mine):
            raise PresenceRejected(f"the peer belongs to another system ({system_root})")
        return peer.claims_durable and (peer.dialed or self._policy.trusts_durable(peer))


def check_not_reserved(collection: str) -> None:
    """Refuse writes to ``_mycelia_`` collections (ARCHITECTURE.md §9)."""
    if is_reserved_collection(collection):
        raise PolicyDenied(f"collection {collection!r} is reserved for Mycelia itself")
