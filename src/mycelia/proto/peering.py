"""The peer-to-peer vocabulary: handshake, requests, responses and pushed updates.

Every class here is a registered :class:`~mycelia.proto.messages.Message` (tags are the
wire contract: never reuse or renumber one). The session that speaks them, with its
transition table, is :mod:`mycelia.node.session`.

Handshake (ARCHITECTURE.md §7): the first frame each way is a :class:`Presence` carrying
the sender's Ed25519 public key (its node id), durable flag, system root, protocol version
and a fresh random challenge; the second frame each way is a :class:`PresenceProof`, the
sender's signature over the peer's challenge (bound to both node ids). A version mismatch
is answered with :class:`PresenceRejected` and a close.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Self

from mycelia.proto.codec import expect_bytes, expect_int, expect_list, expect_str
from mycelia.proto.ids import ID_LENGTH, EntityId, NodeId
from mycelia.proto.limits import Limits
from mycelia.proto.messages import Message, message

__all__ = [
    "CHALLENGE_LENGTH",
    "SIGNATURE_LENGTH",
    "ErrorResponse",
    "Presence",
    "PresenceProof",
    "PresenceRejected",
]

CHALLENGE_LENGTH: Final = 32
SIGNATURE_LENGTH: Final = 64


def _bool(obj: object, what: str) -> bool:
    if not isinstance(obj, bool):
        expect_int(obj, what)  # raises with a clear message
    return bool(obj)


@message(1)
@dataclass(frozen=True, slots=True)
class Presence(Message):
    """The first frame each way: who the sender is and a challenge for the peer to sign."""

    node_id: NodeId
    durable: bool
    system_root: EntityId | None
    protocol_version: int
    challenge: bytes

    def to_wire(self) -> list[object]:
        return [self.node_id, self.durable, self.system_root, self.protocol_version, self.challenge]

    @classmethod
    def from_wire(cls, fields: list[object], limits: Limits) -> Self:
        node, durable, root, version, challenge = expect_list(fields, "Presence", length=5)
        return cls(
            NodeId(expect_bytes(node, "node id", length=ID_LENGTH)),
            _bool(durable, "durable"),
            None if root is None else EntityId(expect_bytes(root, "root", length=ID_LENGTH)),
            expect_int(version, "protocol version", minimum=0),
            expect_bytes(challenge, "challenge", length=CHALLENGE_LENGTH),
        )


@message(2)
@dataclass(frozen=True, slots=True)
class PresenceProof(Message):
    """The second frame each way: a signature over the peer's challenge."""

    signature: bytes

    def to_wire(self) -> list[object]:
        return [self.signature]

    @classmethod
    def from_wire(cls, fields: list[object], limits: Limits) -> Self:
        (signature,) = expect_list(fields, "PresenceProof", length=1)
        return cls(expect_bytes(signature, "signature", length=SIGNATURE_LENGTH))


@message(3)
@dataclass(frozen=True, slots=True)
class PresenceRejected(Message):
    """Sent before closing when the peer's Presence cannot be accepted."""

    reason: str
    expected_version: int
    received_version: int

    def to_wire(self) -> list[object]:
        return [self.reason, self.expected_version, self.received_version]

    @classmethod
    def from_wire(cls, fields: list[object], limits: Limits) -> Self:
        reason, expected, received = expect_list(fields, "PresenceRejected", length=3)
        return cls(
            expect_str(reason, "reason", max_len=1024),
            expect_int(expected, "expected version", minimum=0),
            expect_int(received, "received version", minimum=0),
        )


@message(9)
@dataclass(frozen=True, slots=True)
class ErrorResponse(Message):
    """A request failed on the peer: ``kind`` is the error class name there."""

    request_id: int
    kind: str
    text: str

    def to_wire(self) -> list[object]:
        return [self.request_id, self.kind, self.text]

    @classmethod
    def from_wire(cls, fields: list[object], limits: Limits) -> Self:
        request_id, kind, text = expect_list(fields, "ErrorResponse", length=3)
        return cls(
            expect_int(request_id, "request id", minimum=0),
            expect_str(kind, "error kind", max_len=64),
            expect_str(text, "error text", max_len=4096),
        )
