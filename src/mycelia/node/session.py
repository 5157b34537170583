"""The peer session: a sans-I/O state machine fed frames, producing frames and events.

Lifecycle (STYLE.md §6), one transition table, :data:`TRANSITIONS`::

    AWAIT_PRESENCE --Presence(ok)--> AWAIT_PROOF --PresenceProof(valid)--> READY
          |                               |                                  |
          +-- PresenceRejected / bad ----> CLOSED <------- any protocol error +

Rules:

- The first frame each way is a :class:`Presence`; the second a :class:`PresenceProof`
  that must verify against the peer's key over *our* challenge. Protocol versions must
  match exactly, else we answer :class:`PresenceRejected` and close.
- In READY, requests, responses and updates are passed up as :class:`Received` events;
  anything not in the table for the current state (a request before the proof, a second
  Presence, an unknown tag) is a :class:`~mycelia.errors.RemoteProtocolError` and closes.
- The session never does I/O, never awaits and never reads a clock: the driver
  (:mod:`mycelia.node.peer`) feeds it bytes and writes what it returns.
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from mycelia.errors import DecodeError, PresenceRejected, RemoteProtocolError
from mycelia.node.identity import NodeKey, proof_payload, verify_proof
from mycelia.proto import EntityId, Limits, NodeId
from mycelia.proto.messages import PROTOCOL_VERSION, Message, decode_frame, encode_frame
from mycelia.proto.peering import (
    CHALLENGE_LENGTH,
    RESPONSES,
    ErrorResponse,
    Presence,
    PresenceProof,
    SubscriptionUpdate,
)
from mycelia.proto.peering import PresenceRejected as PresenceRejectedMessage

__all__ = ["TRANSITIONS", "PeerSession", "Received", "SessionState", "Verified"]


class SessionState(enum.Enum):
    """Where a session stands."""

    AWAIT_PRESENCE = "await presence"
    AWAIT_PROOF = "await proof"
    READY = "ready"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Verified:
    """The peer proved its identity: the session is READY."""

    presence: Presence
    token: bytes | None


@dataclass(frozen=True, slots=True)
class Received:
    """A request, response or update from a verified peer."""

    message: Message


SessionEvent = Verified | Received

APPLICATION: Final[tuple[type[Message], ...]] = (
    *RESPONSES,
    *dict.fromkeys(answer for answers in RESPONSES.values() for answer in answers),
    ErrorResponse,
    SubscriptionUpdate,
)
"""What a READY session passes up: every request and response of the protocol
(:data:`~mycelia.proto.peering.RESPONSES`), errors, and pushed updates."""

Handler = Callable[["PeerSession", Message], list[SessionEvent]]


class PeerSession:
    """One side of one connection; see the module docstring."""

    def __init__(
        self,
        *,
        key: NodeKey,
        durable: bool,
        system_root: EntityId | None,
        limits: Limits,
        token: bytes | None = None,
        version: int = PROTOCOL_VERSION,
        challenge: bytes | None = None,
    ) -> None:
        self._key = key
        self._durable = durable
        self._root = system_root
        self._limits = limits
        self._token = token
        self._version = version
        # The node's entropy supplies it (deterministic in a simulation); a fresh random one
        # otherwise. It must never repeat across connections.
        self._challenge = challenge or secrets.token_bytes(CHALLENGE_LENGTH)
        if len(self._challenge) != CHALLENGE_LENGTH:
            raise ValueError(f"a challenge is {CHALLENGE_LENGTH} bytes")
        self._outbox: list[bytes] = []
        self.state = SessionState.AWAIT_PRESENCE
        self.peer: Presence | None = None
        self._next_request = 1

    @property
    def peer_id(self) -> NodeId | None:
        """The peer's node id, once it sent its Presence."""
        return None if self.peer is None else self.peer.node_id

    def start(self) -> list[bytes]:
        """The frames to send first (our Presence)."""
        presence = Presence(
            self._key.node_id, self._durable, self._root, self._version, self._challenge
        )
        return [encode_frame(presence)]

    def receive(self, frame: bytes) -> list[SessionEvent]:
        """Feed one frame; returns events for the driver (and queues frames to send).

        Raises:
            DecodeError: the frame is malformed (the driver closes the connection).
            RemoteProtocolError: the frame is not allowed now (the session is CLOSED).
            PresenceRejected: the peer's Presence was refused, or it refused ours.
        """
        if self.state is SessionState.CLOSED:
            raise RemoteProtocolError("the session is closed")
        try:
            msg = decode_frame(frame, limits=self._limits)
        except DecodeError:
            self.state = SessionState.CLOSED
            raise
        handler = TRANSITIONS.get((self.state, type(msg)))
        if handler is None:
            self.state = SessionState.CLOSED
            raise RemoteProtocolError(
                f"{type(msg).__name__} is not allowed while {self.state.value}"
            )
        return handler(self, msg)

    def take_outgoing(self) -> list[bytes]:
        """Frames queued by :meth:`receive` (proofs, rejections), in order."""
        out, self._outbox = self._outbox, []
        return out

    def next_request_id(self) -> int:
        """A fresh request id for this connection."""
        rid = self._next_request
        self._next_request += 1
        return rid

    def close(self) -> None:
        """Mark the session closed (the driver closes the transport)."""
        self.state = SessionState.CLOSED

    # -- transitions ---------------------------------------------------------------------

    def _on_presence(self, msg: Message) -> list[SessionEvent]:
        assert isinstance(msg, Presence)
        if msg.protocol_version != self._version:
            self._outbox.append(
                encode_frame(
                    PresenceRejectedMessage(
                        "protocol version mismatch", self._version, msg.protocol_version
                    )
                )
            )
            self.state = SessionState.CLOSED
            raise PresenceRejected(
                f"peer speaks protocol {msg.protocol_version}, this node {self._version}"
            )
        self.peer = msg
        payload = proof_payload(msg.challenge, self._key.node_id, msg.node_id)
        self._outbox.append(encode_frame(PresenceProof(self._key.sign(payload), self._token)))
        self.state = SessionState.AWAIT_PROOF
        return []

    def _on_proof(self, msg: Message) -> list[SessionEvent]:
        assert isinstance(msg, PresenceProof)
        assert self.peer is not None
        payload = proof_payload(self._challenge, self.peer.node_id, self._key.node_id)
        if not verify_proof(self.peer.node_id, msg.signature, payload):
            self._outbox.append(
                encode_frame(PresenceRejectedMessage("bad signature", self._version, self._version))
            )
            self.state = SessionState.CLOSED
            raise PresenceRejected("the peer's proof does not verify against its node id")
        self.state = SessionState.READY
        return [Verified(self.peer, msg.token)]

    def _on_rejected(self, msg: Message) -> list[SessionEvent]:
        assert isinstance(msg, PresenceRejectedMessage)
        self.state = SessionState.CLOSED
        raise PresenceRejected(
            f"the peer rejected us: {msg.reason} (it speaks {msg.expected_version}, "
            f"we sent {msg.received_version})"
        )

    def _on_application(self, msg: Message) -> list[SessionEvent]:
        return [Received(msg)]


def _table() -> Mapping[tuple[SessionState, type[Message]], Handler]:
    table: dict[tuple[SessionState, type[Message]], Handler] = {
        (SessionState.AWAIT_PRESENCE, Presence): PeerSession._on_presence,
        (SessionState.AWAIT_PRESENCE, PresenceRejectedMessage): PeerSession._on_rejected,
        (SessionState.AWAIT_PROOF, PresenceProof): PeerSession._on_proof,
        (SessionState.AWAIT_PROOF, PresenceRejectedMessage): PeerSession._on_rejected,
        (SessionState.READY, PresenceRejectedMessage): PeerSession._on_rejected,
    }
    for kind in APPLICATION:
        table[(SessionState.READY, kind)] = PeerSession._on_application
    return table


TRANSITIONS: Final = _table()
"""(state, message type) → handler; anything missing is a protocol error."""
