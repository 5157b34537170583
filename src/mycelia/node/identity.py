"""A node's identity: an Ed25519 key pair; its public key is the node id (ARCHITECTURE.md §7).

The private key is kept in the node's storage (``node_key`` meta record, so an LMDB node
keeps it in its data directory) and created on first open.

Handshake proofs (protocol 3). Each side's Presence carries its key and a fresh challenge;
then:

1. the **listener** (the side that accepted the connection) signs
   :func:`listener_payload`: the version, the direction, its own key and Presence, its
   challenge and the dialer's. It names no peer key: it has verified none yet;
2. the **dialer** verifies that proof, and only then signs :func:`dialer_payload`: the
   version, the direction, both keys (the listener's now verified), both challenges and
   its own Presence;
3. the listener verifies the dialer's proof.

So a proof is good for one connection in one direction only: both challenges are fresh
per connection, so a proof relayed from another connection names the wrong ones; the
direction differs between the two proofs, so a proof reflected back to its signer is
refused; and neither side signs anything naming an unverified peer. (A proof cannot stop a
relay that forwards every byte unchanged between two honest nodes: that is what TLS,
``wss://``, is for.)

Keys are checked before anything is signed or verified with them
(:func:`check_public_key`): an encoding that is not canonical, not on the curve or of
small order is refused, because a small-order key verifies trivial signatures over any
message.
"""

from __future__ import annotations

import functools
from typing import Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from mycelia.errors import PresenceRejected
from mycelia.proto import EntityId, NodeId
from mycelia.storage.meta import NODE_KEY

__all__ = [
    "KEY_META",
    "NodeKey",
    "check_public_key",
    "dialer_payload",
    "listener_payload",
    "verify_proof",
]

KEY_META: Final = NODE_KEY
_PROOF_TAG: Final = b"mycelia/presence-proof/3\0"
_LISTENER: Final = b"L"
_DIALER: Final = b"D"

# Edwards25519 (RFC 8032 §5.1): -x^2 + y^2 = 1 + d x^2 y^2 over GF(p).
_P: Final = 2**255 - 19
_D: Final = -121665 * pow(121666, _P - 2, _P) % _P
_SQRT_M1: Final = pow(2, (_P - 1) // 4, _P)


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


def _presence(*, durable: bool, root: EntityId | None) -> bytes:
    """The signer's durable flag and system root, in a fixed-length form."""
    return (b"\1" if durable else b"\0") + (b"\0" * 33 if root is None else b"\1" + root)


def listener_payload(
    *,
    version: int,
    listener: NodeId,
    durable: bool,
    root: EntityId | None,
    listener_challenge: bytes,
    dialer_challenge: bytes,
) -> bytes:
    """What the listener signs (step 1 of the module docstring)."""
    return b"".join(
        (
            _PROOF_TAG,
            version.to_bytes(4, "big"),
            _LISTENER,
            listener,
            _presence(durable=durable, root=root),
            listener_challenge,
            dialer_challenge,
        )
    )


def dialer_payload(
    *,
    version: int,
    dialer: NodeId,
    listener: NodeId,
    durable: bool,
    root: EntityId | None,
    dialer_challenge: bytes,
    listener_challenge: bytes,
) -> bytes:
    """What the dialer signs once it verified the listener (step 2 of the module docstring)."""
    return b"".join(
        (
            _PROOF_TAG,
            version.to_bytes(4, "big"),
            _DIALER,
            dialer,
            listener,
            _presence(durable=durable, root=root),
            dialer_challenge,
            listener_challenge,
        )
    )


def verify_proof(signer: NodeId, signature: bytes, payload: bytes) -> bool:
    """Whether ``signature`` is ``signer``'s over ``payload`` (False for a key that
    :func:`check_public_key` refuses)."""
    try:
        check_public_key(signer)
        Ed25519PublicKey.from_public_bytes(signer).verify(signature, payload)
    except (InvalidSignature, ValueError, PresenceRejected):
        return False
    return True


def check_public_key(raw: bytes) -> None:
    """Refuse a public key that is not a canonical encoding of a point of large order.

    Raises:
        PresenceRejected: the key is not 32 bytes, its encoding is not canonical (y ≥ p,
            or the sign bit set on x = 0), it is not on the curve, or its order divides 8
            (such a key "verifies" signatures it never made).
    """
    if len(raw) != 32:
        raise PresenceRejected("a node id is a 32-byte Ed25519 public key")
    _check_point(bytes(raw))


@functools.lru_cache(maxsize=4096)
def _check_point(raw: bytes) -> None:
    """:func:`check_public_key`'s curve arithmetic (about 110 µs), remembered for the keys
    that pass: a handshake checks the peer's id, then its proof's signer, the same key
    (a refused key raises, and is not remembered)."""
    encoded = int.from_bytes(raw, "little")
    y, sign = encoded & ((1 << 255) - 1), encoded >> 255
    if y >= _P:
        raise PresenceRejected("the node id is not a canonical Ed25519 key encoding")
    x = _recover_x(y, sign)
    if x is None:
        raise PresenceRejected(
            "the node id is not a canonically encoded point of the Ed25519 curve"
        )
    point = (x, y, 1, x * y % _P)
    for _ in range(3):  # [8]P: the identity exactly when P's order divides 8
        point = _double(point)
    px, py, pz, _pt = point
    if px % _P == 0 and (py - pz) % _P == 0:
        raise PresenceRejected("the node id is a small-order Ed25519 key")


def _recover_x(y: int, sign: int) -> int | None:
    """The x of the point with this y and sign bit (RFC 8032 §5.1.3), or None."""
    u = (y * y - 1) % _P
    v = (_D * y * y + 1) % _P
    x = u * pow(v, 3, _P) * pow(u * pow(v, 7, _P), (_P - 5) // 8, _P) % _P
    check = v * x * x % _P
    if check == (-u) % _P:
        x = x * _SQRT_M1 % _P
    elif check != u:
        return None
    if x == 0 and sign:
        return None  # -0 is not a canonical encoding
    if x & 1 != sign:
        x = _P - x
    return x


def _double(point: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """Doubling in extended coordinates (RFC 8032 §5.1.4)."""
    x, y, z, _t = point
    a, b, c = x * x % _P, y * y % _P, 2 * z * z % _P
    h = (a + b) % _P
    e = (h - (x + y) * (x + y)) % _P
    g = (a - b) % _P
    f = (c + g) % _P
    return e * f % _P, g * h % _P, f * g % _P, e * h % _P
