"""A node's identity: an Ed25519 key pair; its public key is the node id (ARCHITECTURE.md §7).

The private key is kept in the node's storage (``node_key`` meta record, so an LMDB node
keeps it in its data directory) and created on first open. The handshake proof is a
signature over a domain tag, the peer's challenge and both node ids, so a proof made for
one connection cannot be replayed on another.
"""

from __future__ import annotations

from typing import Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from mycelia.proto import NodeId
from mycelia.storage.meta import NODE_KEY

__all__ = ["KEY_META", "NodeKey", "proof_payload", "verify_proof"]

KEY_META: Final = NODE_KEY
_PROOF_TAG: Final = b"mycelia/presence-proof/1"


class NodeKey:
    """An Ed25519 private key and the node id it gives."""

    __slots__ = ("_private", "node_id")

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.node_id = NodeId(raw)

    @classmethod
    def generate(cls) -> NodeKey:
        """A fresh random key."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> NodeKey:
        """A key from its 32 private bytes."""
        return cls(Ed25519PrivateKey.from_private_bytes(raw))

    def private_bytes(self) -> bytes:
        """The 32 private bytes (to store)."""
        return self._private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())

    def sign(self, data: bytes) -> bytes:
        """An Ed25519 signature over ``data``."""
        return self._private.sign(data)


def proof_payload(challenge: bytes, signer: NodeId, verifier: NodeId) -> bytes:
    """What a handshake proof signs: the verifier's challenge, bound to both ids."""
    return _PROOF_TAG + challenge + signer + verifier


def verify_proof(signer: NodeId, signature: bytes, payload: bytes) -> bool:
    """Whether ``signature`` is ``signer``'s over ``payload``."""
    try:
        Ed25519PublicKey.from_public_bytes(signer).verify(signature, payload)
    except (InvalidSignature, ValueError):
        return False
    return True
