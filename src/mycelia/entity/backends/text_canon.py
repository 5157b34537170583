"""Canonical text states: one document's items encoded the same bytes on every replica.

Reused client ids (:class:`~mycelia.entity.backends.client_ids.ClientIds`) let Yrs squash
one client's consecutive items into a block or not depending on how updates arrived;
integrating the whole document in one go into a fresh document squashes every block it
can, so replicas holding the same items encode them byte-identically (ARCHITECTURE.md §1,
§5). This costs O(document): :mod:`mycelia.entity.backends.text` does it only when a
state's buffer is read.

pycrdt is imported when a document is first made (:func:`new_doc`, :func:`root_text`,
:func:`merged_updates`): a process that never holds a text (most clients of LWW data, a
server of them) neither pays for its import nor carries its objects (and anyio's) through
every full garbage collection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from mycelia.errors import DecodeError

if TYPE_CHECKING:
    from pycrdt import Doc, Text

__all__ = [
    "CANON_CLIENT_ID",
    "apply_update",
    "canonical",
    "canonical_update",
    "merge_parts",
    "merged_updates",
    "new_doc",
    "root_text",
]

CANON_CLIENT_ID: Final = 1
"""The client id of the scratch documents that canonicalise (they mint nothing)."""


def new_doc(client_id: int) -> Doc[Any]:
    """A fresh Yrs document minting with ``client_id`` (see the module docstring)."""
    from pycrdt import Doc  # noqa: PLC0415 (when a text is first used)

    return Doc(client_id=client_id)


def root_text(doc: Doc[Any], name: str) -> Text:
    """The root text ``name`` of ``doc``."""
    from pycrdt import Text  # noqa: PLC0415

    root: Text = doc.get(name, type=Text)
    return root


def merged_updates(updates: list[bytes]) -> bytes:
    """Yrs updates merged into one."""
    from pycrdt import merge_updates  # noqa: PLC0415

    return bytes(merge_updates(*updates))


def canonical_update(updates: list[bytes]) -> bytes:
    """The canonical full update of the document those updates (applied in order) make."""
    scratch = new_doc(CANON_CLIENT_ID)
    for update in updates:
        scratch.apply_update(update)
    return canonical(scratch)


def merge_parts(parts: tuple[bytes, ...]) -> bytes:
    """The canonical buffer of a stored text's parts (:meth:`TextBackend.from_parts`);
    raises DecodeError if one is malformed."""
    scratch = new_doc(CANON_CLIENT_ID)
    for part in parts:
        if part:
            apply_update(scratch, part)
    return canonical(scratch)


def canonical(doc: Doc[Any]) -> bytes:
    """The canonical full update of ``doc``: its items integrated in one go into a fresh
    document (see the module docstring)."""
    canon = new_doc(CANON_CLIENT_ID)
    canon.apply_update(doc.get_update())
    return bytes(canon.get_update())


def apply_update(doc: Doc[Any], update: bytes) -> None:
    """Apply ``update`` to ``doc``; DecodeError if it is malformed."""
    try:
        doc.apply_update(update)
    except Exception as exc:  # pycrdt raises ValueError and panics as other types
        raise DecodeError(f"malformed text update: {exc}") from exc
