"""Canonical text states: one document's items encoded the same bytes on every replica.

Reused client ids (:class:`~mycelia.entity.backends.client_ids.ClientIds`) let Yrs squash
one client's consecutive items into a block or not depending on how updates arrived;
integrating the whole document in one go into a fresh document squashes every block it
can, so replicas holding the same items encode them byte-identically (ARCHITECTURE.md §1,
§5). This costs O(document): :mod:`mycelia.entity.backends.text` does it only when a
state's buffer is read.
"""

from __future__ import annotations

from typing import Any, Final

from pycrdt import Doc

from mycelia.errors import DecodeError

__all__ = ["CANON_CLIENT_ID", "apply_update", "canonical", "canonical_update", "merge_parts"]

CANON_CLIENT_ID: Final = 1
"""The client id of the scratch documents that canonicalise (they mint nothing)."""


def canonical_update(updates: list[bytes]) -> bytes:
    """The canonical full update of the document those updates (applied in order) make."""
    scratch: Doc[Any] = Doc(client_id=CANON_CLIENT_ID)
    for update in updates:
        scratch.apply_update(update)
    return canonical(scratch)


def merge_parts(parts: tuple[bytes, ...]) -> bytes:
    """The canonical buffer of a stored text's parts (:meth:`TextBackend.from_parts`);
    raises DecodeError if one is malformed."""
    scratch: Doc[Any] = Doc(client_id=CANON_CLIENT_ID)
    for part in parts:
        if part:
            apply_update(scratch, part)
    return canonical(scratch)


def canonical(doc: Doc[Any]) -> bytes:
    """The canonical full update of ``doc``: its items integrated in one go into a fresh
    document (see the module docstring)."""
    canon: Doc[Any] = Doc(client_id=CANON_CLIENT_ID)
    canon.apply_update(doc.get_update())
    return bytes(canon.get_update())


def apply_update(doc: Doc[Any], update: bytes) -> None:
    """Apply ``update`` to ``doc``; DecodeError if it is malformed."""
    try:
        doc.apply_update(update)
    except Exception as exc:  # pycrdt raises ValueError and panics as other types
        raise DecodeError(f"malformed text update: {exc}") from exc
