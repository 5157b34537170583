"""The peer session: a sans-I/O state machine fed frames, producing frames and events.

Lifecycle (STYLE.md §6), one transition table, :data:`TRANSITIONS`::

    AWAIT_PRESENCE --Presence(ok)--> AWAIT_PROOF --PresenceProof(valid)--> READY
          |                               |                                  |
          +-- PresenceRejected / bad ----> CLOSED <------- any protocol error +

Rules:

- The first frame each way is a :class:`Presence`. Its key must be a valid Ed25519 key
  (canonical, of large order) and its protocol version ours exactly, else we answer
  :class:`PresenceRejected` and close. Then the **listener** sends its proof; the
  **dialer** verifies it and only then sends its own, with its token; the listener
  verifies that (the payloads and why: :mod:`mycelia.node.identity`).
- Before READY a frame may be at most ``limits.max_handshake_bytes``, and every frame's
  tag is read from its first bytes and checked against the table *before* its body is
  decoded: an unauthenticated peer cannot make the node decode anything large, and
  nothing out of place is decoded at all.
- In READY, requests, responses and updates are passed up as :class:`Received` events,
  but for a pushed :class:`~mycelia.proto.peering.SubscriptionUpdate`, which is passed up
  as its frame (:class:`Pushed`) and decoded when it is applied. A
  request frame (a request tag and request id first) with a length or field over a
  limit is passed up as :class:`Faulty` (the driver answers that request with
  PayloadTooLarge; the session goes on). Any other malformed frame is a protocol
  violation and closes (it may be damaged in transit: nothing it says, not even its
  request id, is answered), as is anything not in the table for the current state (a
  request before the proof, a second Presence, an unknown tag).
- The session never does I/O, never awaits and never reads a clock: the driver
  (:mod:`mycelia.node.peer`) feeds it bytes and writes what it returns.
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from mycelia.errors import (
    DecodeError,
    InvalidMessage,
    PayloadTooLarge,
    PresenceRejected,
    RemoteProtocolError,
)
from mycelia.node.identity import (
    NodeKey,
    check_public_key,
    dialer_payload,
    listener_payload,
    verify_proof,
)
from mycelia.proto import EntityId, Limits, NodeId
from mycelia.proto.messages import (
    PROTOCOL_VERSION,
    Message,
    decode_frame,
    encode_frame,
    message_type,
    peek,
)
from mycelia.proto.peering import (
    CHALLENGE_LENGTH,
    PAGES,
    REQUESTS,
    RESPONSES,
    ErrorResponse,
    Presence,
    PresenceProof,
    SubscriptionEnded,
    SubscriptionUpdate,
)
from mycelia.proto.peering import PresenceRejected as PresenceRejectedMessage

__all__ = [
    "TRANSITIONS",
    "Faulty",
    "PeerSession",
    "Pushed",
    "Received",
    "SessionState",
    "Verified",
]


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


@dataclass(frozen=True, slots=True)
class Faulty:
    """A request from a verified peer that could not be decoded: answer ``request_id``
    with ``error`` (the connection goes on)."""

    request_id: int
    error: PayloadTooLarge


@dataclass(frozen=True, slots=True)
class Pushed:
    """A :class:`SubscriptionUpdate` from a verified peer, still its frame (its tag checked
    against the table, nothing else): :meth:`decode` it when it is applied.

    A subscriber that falls behind holds the updates read meanwhile. Held decoded, each
    delta was ten or so objects the garbage collector tracks, which lived long enough to
    be promoted and then visited by every full collection (in W3, 100 clients in one
    process spent half their time there); held as bytes, they are none.
    """

    frame: bytes
    limits: Limits

    def decode(self) -> SubscriptionUpdate:
        """The update; raises DecodeError (InvalidMessage, PayloadTooLarge) for a malformed
        frame: the receiver then ends the session, as for any other malformed frame."""
        msg = decode_frame(self.frame, limits=self.limits)
        if not isinstance(msg, SubscriptionUpdate):  # (its tag said it was one)
            raise InvalidMessage(f"a pushed update decoded as {type(msg).__name__}")
        return msg


SessionEvent = Verified | Received | Faulty | Pushed

APPLICATION: Final[tuple[type[Message], ...]] = (
    *RESPONSES,
    *dict.fromkeys(answer for answers in RESPONSES.values() for answer in answers),
    *PAGES.values(),
    ErrorResponse,
    SubscriptionUpdate,
    SubscriptionEnded,
)
"""What a READY session passes up: every request and response of the protocol
(:data:`~mycelia.proto.peering.RESPONSES`) and their pages, errors, and pushed updates."""

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
        dialer: bool = True,
    ) -> None:
        """``dialer``: whether this side opened the connection (the listener proves
        first; see the module docstring)."""
        self._key = key
        self.dialer = dialer
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
        ready = self.state is SessionState.READY
        if not ready and len(frame) > self._limits.max_handshake_bytes:
            self.state = SessionState.CLOSED
            raise PayloadTooLarge(
                f"a handshake frame is at most {self._limits.max_handshake_bytes} bytes, "
                f"got {len(frame)}"
            )
        tag, request_id = peek(frame)
        kind = message_type(tag)
        if kind is None:
            self.state = SessionState.CLOSED
            raise InvalidMessage("not a frame of this protocol (no known message tag)")
        handler = TRANSITIONS.get((self.state, kind))
        if handler is None:
            state, self.state = self.state, SessionState.CLOSED
            raise RemoteProtocolError(f"{kind.__name__} is not allowed while {state.value}")
        if kind is SubscriptionUpdate:
            return [Pushed(frame, self._limits)]  # (READY: the table said so)
        try:
            msg = decode_frame(frame, limits=self._limits)
        except PayloadTooLarge as exc:
            if ready and request_id is not None and issubclass(kind, REQUESTS):
                return [Faulty(request_id, exc)]  # that request fails, not the connection
            self.state = SessionState.CLOSED
            raise
        except DecodeError:
            self.state = SessionState.CLOSED
            raise
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
            self._reject("protocol version mismatch", msg.protocol_version)
            raise PresenceRejected(
                f"peer speaks protocol {msg.protocol_version}, this node {self._version}"
            )
        try:
            check_public_key(msg.node_id)
        except PresenceRejected as exc:
            self._reject(str(exc), self._version)
            raise
        self.peer = msg
        if not self.dialer:  # the listener proves first, naming no peer (identity.py)
            self._outbox.append(
                encode_frame(PresenceProof(self._key.sign(self._listener_payload()), self._token))
            )
        self.state = SessionState.AWAIT_PROOF
        return []

    def _on_proof(self, msg: Message) -> list[SessionEvent]:
        assert isinstance(msg, PresenceProof)
        assert self.peer is not None
        payload = self._listener_payload() if self.dialer else self._dialer_payload()
        if not verify_proof(self.peer.node_id, msg.signature, payload):
            self._reject("bad signature", self._version)
            raise PresenceRejected("the peer's proof does not verify against its node id")
        if self.dialer:  # the listener is verified: now sign what names it
            proof = PresenceProof(self._key.sign(self._dialer_payload()), self._token)
            self._outbox.append(encode_frame(proof))
        self.state = SessionState.READY
        return [Verified(self.peer, msg.token)]

    def _listener_payload(self) -> bytes:
        """What the listener signs: by us if we listen, by the peer if we dialed."""
        assert self.peer is not None
        listener = self.peer if self.dialer else None
        return listener_payload(
            version=self._version,
            listener=self._key.node_id if listener is None else listener.node_id,
            durable=self._durable if listener is None else listener.durable,
            root=self._root if listener is None else listener.system_root,
            listener_challenge=self._challenge if listener is None else listener.challenge,
            dialer_challenge=self.peer.challenge if listener is None else self._challenge,
        )

    def _dialer_payload(self) -> bytes:
        """What the dialer signs: by us if we dialed, by the peer if we listen."""
        assert self.peer is not None
        dialer = None if self.dialer else self.peer
        return dialer_payload(
            version=self._version,
            dialer=self._key.node_id if dialer is None else dialer.node_id,
            listener=self.peer.node_id if dialer is None else self._key.node_id,
            durable=self._durable if dialer is None else dialer.durable,
            root=self._root if dialer is None else dialer.system_root,
            dialer_challenge=self._challenge if dialer is None else dialer.challenge,
            listener_challenge=self.peer.challenge if dialer is None else self._challenge,
        )

    def _reject(self, reason: str, received: int) -> None:
        """Queue a PresenceRejected saying ``reason`` and close."""
        self._outbox.append(
            encode_frame(PresenceRejectedMessage(reason[:1024], self._version, received))
        )
        self.state = SessionState.CLOSED

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
