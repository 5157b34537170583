"""A token-based policy agent for servers (ARCHITECTURE.md §9).

A token is a signed grant: who (``subject``), until when (``expires``, unix seconds), and
per collection what (``read``, ``write``). Tokens are signed with an issuer's Ed25519 key
(:class:`TokenIssuer`); the server's :class:`TokenAgent` holds only the issuer's public key
and checks every connect, read and write against the grant. Without a valid token a peer
may connect but can read and write nothing. Time is injected (``now``) so tests need no
clock tricks.

Wire form: ``msgpack([TOKEN_TAG, subject, expires, [[collection, read, write], ...]])``
followed by the 64-byte signature over those bytes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from mycelia.entity import Snapshot
from mycelia.errors import DecodeError, PolicyDenied
from mycelia.node.policy import Credentials, PeerInfo
from mycelia.proto import AdmittedEvent
from mycelia.proto.codec import expect_int, expect_list, expect_name, expect_str, pack, unpack

__all__ = ["Grant", "TokenAgent", "TokenIssuer"]

TOKEN_TAG: Final = "mycelia/token/1"  # noqa: S105 - a format tag, not a secret
SIGNATURE: Final = 64


@dataclass(frozen=True, slots=True)
class Grant:
    """What a verified token allows."""

    subject: str
    expires: int
    collections: Mapping[str, tuple[bool, bool]]
    """collection → (may read, may write); ``*`` matches every collection."""

    def allows(self, collection: str, *, write: bool) -> bool:
        """Whether this grant reads (or writes) ``collection``."""
        rule = self.collections.get(collection, self.collections.get("*"))
        return rule is not None and rule[1 if write else 0]


class TokenIssuer:
    """Signs tokens (keep this on the issuing service; give servers :attr:`public_key`)."""

    def __init__(self, key: Ed25519PrivateKey | None = None) -> None:
        self._key = key or Ed25519PrivateKey.generate()

    @property
    def public_key(self) -> bytes:
        """The raw public key a :class:`TokenAgent` verifies with."""
        return self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    def issue(
        self,
        subject: str,
        collections: Mapping[str, tuple[bool, bool]],
        *,
        expires: int,
    ) -> bytes:
        """A token for ``subject`` granting (read, write) per collection until ``expires``."""
        rows = [[name, read, write] for name, (read, write) in sorted(collections.items())]
        body = pack([TOKEN_TAG, subject, expires, rows])
        return body + self._key.sign(body)


class TokenAgent:
    """Checks connects, reads and writes against signed tokens; see the module docstring."""

    def __init__(self, issuer_public_key: bytes, *, now: Callable[[], float] = time.time) -> None:
        self._issuer = Ed25519PublicKey.from_public_bytes(issuer_public_key)
        self._now = now

    def grant(self, credentials: Credentials) -> Grant | None:
        """The grant of a valid, unexpired token (``None`` otherwise)."""
        token = credentials.token
        if token is None or len(token) <= SIGNATURE:
            return None
        body, signature = token[:-SIGNATURE], token[-SIGNATURE:]
        try:
            self._issuer.verify(signature, body)
            tag, subject, expires, rows = expect_list(unpack(body, what="token"), "token", length=4)
            if tag != TOKEN_TAG:
                return None
            grant = Grant(
                expect_str(subject, "subject", max_len=256),
                expect_int(expires, "expires"),
                {
                    expect_name(row[0], "collection") if row[0] != "*" else "*": (
                        bool(row[1]),
                        bool(row[2]),
                    )
                    for row in (
                        expect_list(r, "rule", length=3) for r in expect_list(rows, "rules")
                    )
                },
            )
        except (InvalidSignature, DecodeError):
            return None
        return grant if grant.expires > self._now() else None

    def check_connect(self, peer: PeerInfo, credentials: Credentials) -> None:
        """Anyone may connect; a token that is present must be valid."""
        if credentials.token is not None and self.grant(credentials) is None:
            raise PolicyDenied("the token is invalid or expired")

    def trusts_durable(self, peer: PeerInfo) -> bool:
        """Peers that dial in are clients."""
        return False

    def can_read(self, credentials: Credentials, snapshot: Snapshot) -> bool:
        """Local contexts read everything; peers read what their grant allows."""
        if credentials.local:
            return True
        grant = self.grant(credentials)
        return grant is not None and grant.allows(snapshot.collection, write=False)

    def check_event(
        self,
        credentials: Credentials,
        before: Snapshot,
        after: Snapshot,
        event: AdmittedEvent,
    ) -> None:
        """Peers write what their grant allows; local contexts write anything."""
        if credentials.local:
            return
        grant = self.grant(credentials)
        if grant is None or not grant.allows(after.collection, write=True):
            raise PolicyDenied(f"no grant to write {after.collection!r}")
