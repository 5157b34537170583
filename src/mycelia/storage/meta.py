"""The node-level records a store holds (``WriteBatch.meta``) and what each must look like.

A dump carries these records; :func:`mycelia.storage.dump.load_from` checks every one with
:func:`check_meta` before anything is staged, so a value the node would choke on (a 2-byte
node key: ``serve`` crashed on it) never loads. The node layer writes them under the names
defined here (it imports them); the applier writes the ``unsure/`` ones, under its own
name. A new record must be added to :data:`META_FORMATS` (or, for a family of records,
:data:`META_PREFIXES`), or a dump holding it is refused.

Formats:

==================  ============================================================
key                 value
==================  ============================================================
``node_key``        the node's Ed25519 private key: 32 raw bytes (the node id is
                    its public key, :mod:`mycelia.node.identity`)
``system_root``     the id of the system's root entity: 32 bytes
``outbox/<seq>``    one owed commit (``seq``: 20 digits, commit order): a msgpack
                    array of ``[generation, canonical event bytes]`` pairs
``outbox``          (older versions) every owed event in one msgpack array of
                    canonical event bytes; a node migrates it when it opens
``unsure/<id>``     an ephemeral node's entity (``id``: its base64 entity id) whose
                    head a local commit may have left holding an ancestor of another
                    tip, until the durable peer's history settles it: empty
==================  ============================================================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final

from mycelia.entity.unsure import UNSURE_PREFIX
from mycelia.errors import DecodeError
from mycelia.proto import EntityId, Event
from mycelia.proto.codec import expect_bytes, expect_int, expect_list, unpack
from mycelia.proto.ids import ID_LENGTH
from mycelia.storage.engine import STORED_LIMITS

__all__ = [
    "META_FORMATS",
    "META_PREFIXES",
    "NODE_KEY",
    "OUTBOX",
    "OUTBOX_PREFIX",
    "SYSTEM_ROOT",
    "check_meta",
]

NODE_KEY: Final = "node_key"
SYSTEM_ROOT: Final = "system_root"
OUTBOX: Final = "outbox"
"""The single outbox record of older versions (migrated to :data:`OUTBOX_PREFIX` ones)."""
OUTBOX_PREFIX: Final = "outbox/"
"""One record per owed commit: ``outbox/`` and a zero-padded sequence number."""

_KEY_LENGTH: Final = 32
_SEQ_DIGITS: Final = 20


def _node_key(value: bytes) -> None:
    # Every 32-byte string is an Ed25519 private key (RFC 8032 §5.1.5): the length is all.
    if len(value) != _KEY_LENGTH:
        raise DecodeError(f"{len(value)} bytes, not an Ed25519 private key ({_KEY_LENGTH})")


def _system_root(value: bytes) -> None:
    if len(value) != ID_LENGTH:
        raise DecodeError(f"{len(value)} bytes, not an entity id ({ID_LENGTH})")


def _outbox(value: bytes) -> None:
    items = expect_list(unpack(value, limits=STORED_LIMITS, what=OUTBOX), OUTBOX)
    for item in items:
        Event.from_bytes(expect_bytes(item, "owed event"), limits=STORED_LIMITS)


def _owed_commit(value: bytes) -> None:
    items = expect_list(unpack(value, limits=STORED_LIMITS, what="owed commit"), "owed commit")
    for item in items:
        generation, body = expect_list(item, "owed event", length=2)
        expect_int(generation, "owed generation", minimum=1)
        Event.from_bytes(expect_bytes(body, "owed event"), limits=STORED_LIMITS)


META_FORMATS: Final[Mapping[str, Callable[[bytes], None]]] = MappingProxyType(
    {NODE_KEY: _node_key, SYSTEM_ROOT: _system_root, OUTBOX: _outbox}
)
"""Each known record's check: raises DecodeError for a value of the wrong form."""


def _sequence_number(suffix: str) -> bool:
    return len(suffix) == _SEQ_DIGITS and suffix.isdigit()


def _entity_id(suffix: str) -> bool:
    try:
        EntityId.from_base64(suffix)
    except DecodeError:
        return False
    return True


def _empty(value: bytes) -> None:
    if value:
        raise DecodeError(f"{len(value)} bytes where none belong")


META_PREFIXES: Final[Mapping[str, tuple[Callable[[str], bool], Callable[[bytes], None]]]] = (
    MappingProxyType(
        {OUTBOX_PREFIX: (_sequence_number, _owed_commit), UNSURE_PREFIX: (_entity_id, _empty)}
    )
)
"""Families of records (by key prefix): which suffixes name one, and the value's check."""


def _by_prefix(key: str) -> Callable[[bytes], None] | None:
    for prefix, (names, check) in META_PREFIXES.items():
        suffix = key.removeprefix(prefix)
        if suffix != key and names(suffix):
            return check
    return None


def check_meta(key: str, value: bytes) -> None:
    """Raise DecodeError unless ``value`` is a well-formed record ``key``."""
    check = META_FORMATS.get(key) or _by_prefix(key)
    if check is None:
        raise DecodeError(
            f"meta record {key!r} is not one this version knows ({', '.join(META_FORMATS)}); "
            "a newer version's dump needs a newer mycelia to load"
        )
    try:
        check(value)
    except DecodeError as exc:
        raise DecodeError(f"meta record {key!r} is malformed: {exc}") from exc
