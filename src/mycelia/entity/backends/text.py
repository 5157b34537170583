"""Collaborative text: one pycrdt (Yrs) document per entity, one root text per property.

Invariants (ARCHITECTURE.md §5 "Text"):

- Diffs are Yrs updates; applying them is commutative and idempotent, so every replica
  that applies the same set of events ends with identical text, whatever the order.
- The state buffer is the document's full update (``Doc.get_update()``). Replicas with the
  same content produce the same buffer in practice (Yrs encodes blocks per client in
  client order), which the convergence tests record.
- Local edits happen on a fork with its own Yrs client id; :meth:`take_diff` returns the
  update since the fork (or the last diff). A client id must never be used by two live
  forks at once (Yrs would mint two items with one id), so forks draw fresh ids from the
  injected :class:`ClientIds`.
- A document made without a :class:`ClientIds` (a resident entity, a decoded state, a
  peer's state being merged) is a *replica*: it applies and merges updates but refuses
  local edits (:class:`~mycelia.errors.TransactionError`), so it needs no client id of its
  own and this module draws no entropy (STYLE.md §3). Its Yrs client id is
  :data:`REPLICA_CLIENT_ID`, which mints nothing.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar, Final, Self

from pycrdt import Doc, Text

from mycelia.errors import DecodeError, TransactionError
from mycelia.proto import AdmittedEvent

__all__ = ["REPLICA_CLIENT_ID", "ClientIds", "TextBackend"]

REPLICA_CLIENT_ID: Final = 0
"""The Yrs client id of a replica document (it takes no local edits, so it mints no items;
:class:`ClientIds` only hands out odd ids, never this one)."""


class ClientIds:
    """Yrs client ids for forks (injectable for determinism), leased and given back.

    A Yrs document slows down with the number of client ids it has seen, so a node reuses
    ids: a transaction leases one for its forks and releases it once its edits are either
    published here (committed: the resident document holds every item made with it) or
    never will be (rolled back). Two live forks never share an id.
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        # ids, not secrets; without an injected rng, one seeded from the OS (the caller's
        # choice: a node passes its own entropy when it has been given one).
        self._rng = rng or random.Random()
        self._free: list[int] = []

    def next(self) -> int:
        """A client id no live fork holds: a released one, or a fresh random one."""
        if self._free:
            return self._free.pop()
        return self._rng.getrandbits(52) | 1

    def release(self, client_id: int) -> None:
        """Give back an id whose fork's edits are all published here, or discarded.

        A replica's id (:data:`REPLICA_CLIENT_ID`) was never leased and is ignored.
        """
        if client_id != REPLICA_CLIENT_ID and client_id not in self._free:
            self._free.append(client_id)


def _new_doc(ids: ClientIds | None) -> Doc[Any]:
    """A document with a fresh client id from ``ids``, or a replica's without ``ids``."""
    return Doc(client_id=REPLICA_CLIENT_ID if ids is None else ids.next())


class TextBackend:
    """Text properties of one entity, backed by one Yrs document."""

    name: ClassVar[str] = "text"
    __slots__ = ("_doc", "_edited", "_mark")

    def __init__(self, doc: Doc[Any], mark: bytes) -> None:
        self._doc = doc
        self._mark = mark  # state vector at the fork (or the last take_diff)
        # A deletion does not move the state vector, so "edited" is tracked explicitly.
        self._edited = False

    @classmethod
    def empty(cls, ids: ClientIds | None = None) -> Self:
        """No text; local edits on it use a client id from ``ids`` (a replica without)."""
        doc = _new_doc(ids)
        return cls(doc, doc.get_state())

    @classmethod
    def from_state(cls, buffer: bytes, ids: ClientIds | None = None) -> Self:
        """Rebuild from a full update (a replica without ``ids``); raises DecodeError if
        malformed."""
        doc = _new_doc(ids)
        _apply_update(doc, buffer)
        return cls(doc, doc.get_state())

    def to_state(self) -> bytes:
        """The full document as one update, canonical for its content.

        Reused client ids (:class:`ClientIds`) let Yrs squash one client's consecutive
        items into a block or not depending on how updates arrived; integrating the whole
        document in one go squashes every block it can, so replicas holding the same items
        encode them byte-identically (ARCHITECTURE.md §1).
        """
        canon: Doc[Any] = Doc(client_id=1)
        canon.apply_update(self._doc.get_update())
        return bytes(canon.get_update())

    def apply(self, event: AdmittedEvent, diffs: tuple[bytes, ...]) -> set[str]:
        """Apply Yrs updates; returns the text properties they may have changed.

        (Every text root is reported: reading every text to compare costs O(document) per
        event; consumers compare values where it matters, so over-reporting is harmless.)
        """
        for diff in diffs:
            _apply_update(self._doc, diff)
        return set(self._doc.keys())

    @property
    def client_id(self) -> int:
        """The Yrs client id local edits on this copy are made with."""
        return int(self._doc.client_id)

    @property
    def is_replica(self) -> bool:
        """Whether this copy was made without client ids (it refuses local edits)."""
        return self.client_id == REPLICA_CLIENT_ID

    def merge(self, other: Self) -> set[str]:
        """Apply the other document's full state (Yrs updates are idempotent)."""
        before = self.values()
        _apply_update(self._doc, other.to_state())
        after = self.values()
        return {p for p in after if before.get(p) != after[p]}

    def fork(self, ids: ClientIds | None = None) -> Self:
        """A copy with a fresh client id from ``ids`` (a replica without), O(document)."""
        doc = _new_doc(ids)
        doc.apply_update(self._doc.get_update())
        return type(self)(doc, doc.get_state())

    def text(self, prop: str) -> Text:
        """The root text of ``prop`` (created empty on first use); read it, edit through
        :meth:`insert`, :meth:`delete` and :meth:`replace`."""
        text: Text = self._doc.get(prop, type=Text)
        return text

    def insert(self, prop: str, offset: int, text: str) -> None:
        """Insert ``text`` at UTF-8 byte ``offset`` of ``prop`` (a local edit)."""
        self._begin_edit()
        self.text(prop).insert(offset, text)

    def delete(self, prop: str, start: int, stop: int) -> None:
        """Delete UTF-8 bytes ``start:stop`` of ``prop`` (a local edit)."""
        self._begin_edit()
        del self.text(prop)[start:stop]

    def replace(self, prop: str, text: str) -> None:
        """Replace the whole of ``prop`` (a local edit, one Yrs transaction)."""
        self._begin_edit()
        target = self.text(prop)
        with self._doc.transaction():
            del target[0 : len(target)]
            target.insert(0, text)

    def _begin_edit(self) -> None:
        if self.is_replica:
            raise TransactionError(
                "a replica's text takes no local edits: edit a fork made with ClientIds"
            )
        self._edited = True

    def take_diff(self) -> bytes | None:
        """The edits since the fork (or the last diff) as one Yrs update, or ``None``."""
        if not self._edited:
            return None
        diff = bytes(self._doc.get_update(self._mark))
        self._mark = self._doc.get_state()
        self._edited = False
        return diff

    def values(self) -> dict[str, object]:
        """Every property's text (roots of other Yrs types, from a newer peer, are skipped)."""
        doc = self._doc
        out: dict[str, object] = {}
        for key in list(doc.keys()):
            try:
                out[key] = str(doc.get(key, type=Text))
            except (TypeError, ValueError):
                continue
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TextBackend) and self.values() == other.values()

    __hash__ = None  # type: ignore[assignment]


def _apply_update(doc: Doc[Any], update: bytes) -> None:
    try:
        doc.apply_update(update)
    except Exception as exc:  # pycrdt raises ValueError and panics as other types
        raise DecodeError(f"malformed text update: {exc}") from exc
