"""Where ``mycelia serve`` takes its node key from (ARCHITECTURE.md §7, docs/deploying.md).

A server on PostgreSQL keeps nothing that matters on its disk, so its Ed25519 node key
(its identity in every handshake) comes from one of, in this order:

- ``--key-file FILE``: a PEM secret key (``mycelia token keygen --secret-file FILE`` or
  ``openssl genpkey -algorithm ed25519`` makes one), e.g. a mounted secret;
- ``MYCELIA_NODE_KEY`` (or ``--node-key``, which shows in the process list): the PEM text
  itself, or the 32 secret bytes in base64;
- ``--node-name NAME`` (``--postgres`` only): the key kept in the database under that
  name, made by the first server to start with it (atomically: replicas starting together
  with one name get one key);
- none of these: the store's own ``node_key`` record, made on first start (an LMDB data
  directory keeps it; on PostgreSQL every replica without a name shares it).

Invariants: at most one of the first three is given (ConfigError otherwise), a bad key is
one ConfigError naming where it came from, and nothing is written for a key given from
outside.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import secrets
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)

from mycelia.cli.settings import env_option
from mycelia.errors import ConfigError, StorageError
from mycelia.node.identity import NodeKey
from mycelia.storage import StorageEngine

__all__ = ["add_key_flags", "given_key", "named_key"]

_RAW_LENGTH = 32


def add_key_flags(cmd: argparse.ArgumentParser) -> None:
    """``--key-file``, ``--node-key`` and ``--node-name``, each with its variable."""
    env_option(
        cmd, "--key-file", env="MYCELIA_KEY_FILE", default=None, metavar="FILE",
        help="the node's Ed25519 secret key (PEM), e.g. a mounted secret; the store then "
        "keeps no key",
    )  # fmt: skip
    env_option(
        cmd, "--node-key", env="MYCELIA_NODE_KEY", default=None, metavar="KEY",
        help="the node key itself: PEM text, or its 32 secret bytes in base64 (set the "
        "variable rather than the flag: a flag shows in the process list)",
    )  # fmt: skip
    env_option(
        cmd, "--node-name", env="MYCELIA_NODE_NAME", default=None, metavar="NAME",
        help="with --postgres: keep this node's key in the database under NAME, made on "
        "first start (replicas with different names have different keys)",
    )  # fmt: skip


def given_key(args: argparse.Namespace) -> NodeKey | None:
    """The key given by file or by value (``None``: by name, or the store's own), read
    before anything else starts. Raises ConfigError for a bad key or contradicting
    options."""
    given = [f for f, v in _sources(args) if v is not None]
    if len(given) > 1:
        raise ConfigError(f"give one node key source, not {' and '.join(given)}")
    if args.node_name is not None and not args.postgres:
        raise ConfigError("--node-name keeps the key in PostgreSQL: it needs --postgres")
    if args.node_name is not None and not args.node_name.strip():
        raise ConfigError("--node-name is empty")
    if args.key_file is not None:
        return _from_pem(_read(args.key_file), f"--key-file {args.key_file}")
    if args.node_key is not None:
        return _from_text(args.node_key)
    return None


def _sources(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    return [
        ("--key-file", args.key_file),
        ("--node-key (MYCELIA_NODE_KEY)", args.node_key),
        ("--node-name", args.node_name),
    ]


async def named_key(args: argparse.Namespace, storage: StorageEngine) -> NodeKey | None:
    """With ``--node-name``, the key the store keeps under that name, made now if it has
    none (``None`` without it: the store's own). Raises ConfigError."""
    if args.node_name is None:
        return None
    keep = getattr(storage, "node_key", None)
    if keep is None:
        raise ConfigError("--node-name needs a store that keeps keys by name (--postgres)")
    try:
        raw = await keep(args.node_name, secrets.token_bytes(_RAW_LENGTH))
    except StorageError as exc:
        raise ConfigError(f"cannot keep the node key in PostgreSQL: {exc}") from exc
    return NodeKey.from_private_bytes(raw)


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError as exc:
        raise ConfigError(f"the node key file {path} does not exist") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read the node key file {path}: {exc.strerror}") from exc


def _from_text(text: str) -> NodeKey:
    where = "MYCELIA_NODE_KEY (--node-key)"
    if text.lstrip().startswith("-----BEGIN"):
        return _from_pem(text.encode(), where)
    try:
        compact = text.strip()
        raw = base64.b64decode(compact + "=" * (-len(compact) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ConfigError(f"{where} is neither PEM nor base64") from exc
    if len(raw) != _RAW_LENGTH:
        raise ConfigError(f"{where} holds {len(raw)} bytes, not an Ed25519 secret key (32)")
    return NodeKey.from_private_bytes(raw)


def _from_pem(pem: bytes, where: str) -> NodeKey:
    try:
        key = load_pem_private_key(pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise ConfigError(
            f"{where} is not an unencrypted PEM Ed25519 secret key "
            "(make one with 'mycelia token keygen --secret-file FILE')"
        ) from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"{where} holds a {type(key).__name__}, not an Ed25519 key")
    raw = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return NodeKey.from_private_bytes(raw)
