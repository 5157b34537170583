"""A token-based policy agent for servers (ARCHITECTURE.md §9).

A token is a signed grant: who (``subject``), until when (``expires``, unix seconds), and
per collection what (``read``, ``write``). Tokens are signed with an issuer's Ed25519 key
(:class:`TokenIssuer`); the server's :class:`TokenAgent` holds only the issuer's public key
and checks every connect, read and write against the grant. Time is injected (``now``) so
tests need no clock tricks.

Invariants:

- A token is trusted only once its signature verifies against the issuer's key; its
  expiry is checked against ``now`` on every use, so a cached grant still expires.
- With ``require_token=True`` (``mycelia serve --auth tokens``) a peer without a valid
  token is refused at the handshake; otherwise it may connect and reads and writes nothing.
- The collection ``*`` in a grant matches every collection; :data:`METRICS_SCOPE` (read)
  lets a token scrape ``GET /metrics`` when the server asks for one.

Wire form: ``msgpack([TOKEN_TAG, subject, expires, [[collection, read, write], ...]])``
followed by the 64-byte signature over those bytes. As text (the command line, an HTTP
``Authorization: Bearer`` header) a token is unpadded URL-safe base64.

Key files are PEM (PKCS#8 for the secret, SubjectPublicKeyInfo for the public key), as
``openssl genpkey -algorithm ed25519`` and ``openssl pkey -pubout`` write them.
"""

from __future__ import annotations

import base64
import binascii
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
    load_pem_public_key,
)

from mycelia.entity import Snapshot
from mycelia.errors import ConfigError, DecodeError, PolicyDenied
from mycelia.node.policy import Credentials, PeerInfo
from mycelia.proto import AdmittedEvent
from mycelia.proto.codec import expect_int, expect_list, expect_name, expect_str, pack, unpack

__all__ = [
    "METRICS_SCOPE",
    "Grant",
    "TokenAgent",
    "TokenIssuer",
    "decode_token",
    "encode_token",
    "load_public_key",
    "parse_token",
]

TOKEN_TAG: Final = "mycelia/token/1"  # noqa: S105 - a format tag, not a secret
SIGNATURE: Final = 64
METRICS_SCOPE: Final = "_mycelia_metrics"
"""A grant to read this (reserved) collection name lets a token scrape ``/metrics``."""
CACHED_GRANTS: Final = 1024
"""Verified tokens remembered per agent (a read check runs per entity per update)."""


@dataclass(frozen=True, slots=True)
class Grant:
    """What a token says (verified, when an agent returns it)."""

    subject: str
    expires: int
    collections: Mapping[str, tuple[bool, bool]]
    """collection → (may read, may write); ``*`` matches every collection."""

    def allows(self, collection: str, *, write: bool) -> bool:
        """Whether this grant reads (or writes) ``collection``."""
        rule = self.collections.get(collection, self.collections.get("*"))
        return rule is not None and rule[1 if write else 0]

    def describe(self) -> list[str]:
        """The rules as ``read:COLLECTION`` / ``write:COLLECTION`` words, sorted."""
        words = []
        for name, (read, write) in sorted(self.collections.items()):
            if name == METRICS_SCOPE and read:
                words.append("metrics")
                continue
            words += [f"{verb}:{name}" for verb, on in (("read", read), ("write", write)) if on]
        return words


def encode_token(token: bytes) -> str:
    """A token as text (unpadded URL-safe base64)."""
    return base64.urlsafe_b64encode(token).rstrip(b"=").decode("ascii")


def decode_token(text: str) -> bytes:
    """The bytes of a token given as text; raises DecodeError if it is not base64."""
    text = text.strip()
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise DecodeError(
            "a token is URL-safe base64 text, as 'mycelia token issue' prints"
        ) from exc


def parse_token(token: bytes) -> tuple[Grant, bytes, bytes]:
    """The grant a token claims, its signed body and its signature — **not verified**.

    Raises DecodeError if the bytes are not a token of this format.
    """
    if len(token) <= SIGNATURE:
        raise DecodeError("too short to be a token")
    body, signature = token[:-SIGNATURE], token[-SIGNATURE:]
    tag, subject, expires, rows = expect_list(unpack(body, what="token"), "token", length=4)
    if tag != TOKEN_TAG:
        raise DecodeError(f"not a {TOKEN_TAG} token")
    rules: dict[str, tuple[bool, bool]] = {}
    for raw in expect_list(rows, "rules"):
        name, read, write = expect_list(raw, "rule", length=3)
        rules[name if name == "*" else expect_name(name, "collection")] = (bool(read), bool(write))
    grant = Grant(
        expect_str(subject, "subject", max_len=256), expect_int(expires, "expires"), rules
    )
    return grant, body, signature


class TokenIssuer:
    """Signs tokens (keep this on the issuing service; give servers :attr:`public_key`)."""

    def __init__(self, key: Ed25519PrivateKey | None = None) -> None:
        self._key = key or Ed25519PrivateKey.generate()

    @classmethod
    def from_secret_file(cls, path: str | os.PathLike[str]) -> TokenIssuer:
        """The issuer whose PEM secret key is in ``path``; raises ConfigError if unusable."""
        pem = _read_key_file(path, "secret")
        try:
            key = load_pem_private_key(pem, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise ConfigError(
                f"{path} is not an unencrypted PEM Ed25519 secret key "
                "(make one with 'mycelia token keygen --secret-file FILE')"
            ) from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError(f"{path} holds a {type(key).__name__}, not an Ed25519 key")
        return cls(key)

    def write_secret_file(self, path: str | os.PathLike[str]) -> None:
        """Write the secret key to a new file only its owner can read (never overwrites)."""
        pem = self._key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError as exc:
            raise ConfigError(f"{path} exists already: refusing to overwrite a key") from exc
        except OSError as exc:
            raise ConfigError(f"cannot create {path}: {exc.strerror}") from exc
        with os.fdopen(fd, "wb") as f:
            f.write(pem)

    @property
    def public_key(self) -> bytes:
        """The raw public key a :class:`TokenAgent` verifies with."""
        return self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    def public_key_pem(self) -> str:
        """The public key as PEM text (what ``--token-public-key-file`` reads)."""
        pem = self._key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
        return pem.decode("ascii")

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


def load_public_key(path: str | os.PathLike[str]) -> bytes:
    """The raw Ed25519 public key in the PEM file ``path``; raises ConfigError if unusable."""
    pem = _read_key_file(path, "public")
    try:
        key = load_pem_public_key(pem)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise ConfigError(f"{path} is not a PEM Ed25519 public key") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError(f"{path} holds a {type(key).__name__}, not an Ed25519 key")
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def _read_key_file(path: str | os.PathLike[str], kind: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError as exc:
        raise ConfigError(f"the token {kind} key file {path} does not exist") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read the token {kind} key file {path}: {exc.strerror}") from exc


class TokenAgent:
    """Checks connects, reads and writes against signed tokens; see the module docstring."""

    def __init__(
        self,
        issuer_public_key: bytes,
        *,
        now: Callable[[], float] = time.time,
        require_token: bool = False,
    ) -> None:
        self._issuer = Ed25519PublicKey.from_public_bytes(issuer_public_key)
        self._now = now
        self.require_token = require_token
        self._verified: OrderedDict[bytes, Grant] = OrderedDict()

    def verify(self, token: bytes) -> Grant:
        """The grant of a valid, unexpired token.

        Raises:
            PolicyDenied: the token is malformed, not signed by the issuer, or expired
                (the message says which).
        """
        grant = self._verified.get(token)
        if grant is None:
            try:
                grant, body, signature = parse_token(token)
                self._issuer.verify(signature, body)
            except DecodeError as exc:
                raise PolicyDenied(f"the token is malformed ({exc})") from exc
            except InvalidSignature as exc:
                raise PolicyDenied(
                    "the token's signature does not verify: it was altered, or issued "
                    "with another key than this server's"
                ) from exc
            self._verified[token] = grant
            if len(self._verified) > CACHED_GRANTS:
                self._verified.popitem(last=False)
        if grant.expires <= self._now():
            raise PolicyDenied(f"the token of {grant.subject!r} expired: issue a new one")
        return grant

    def grant(self, credentials: Credentials) -> Grant | None:
        """The grant of a valid, unexpired token (``None`` otherwise)."""
        if credentials.token is None:
            return None
        try:
            return self.verify(credentials.token)
        except PolicyDenied:
            return None

    def subject(self, credentials: Credentials) -> str | None:
        """Who a valid token names (for logs)."""
        grant = self.grant(credentials)
        return None if grant is None else grant.subject

    def check_connect(self, peer: PeerInfo, credentials: Credentials) -> None:
        """A token that is present must be valid; with ``require_token``, one must be."""
        if credentials.token is not None:
            self.verify(credentials.token)
        elif self.require_token:
            raise PolicyDenied(
                "this server requires a token: pass token= to mycelia.connect "
                "('mycelia token issue' makes one)"
            )

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

    def allows_metrics(self, token: bytes) -> bool:
        """Whether ``token`` is valid and grants :data:`METRICS_SCOPE` (``GET /metrics``)."""
        try:
            return self.verify(token).allows(METRICS_SCOPE, write=False)
        except PolicyDenied:
            return False
