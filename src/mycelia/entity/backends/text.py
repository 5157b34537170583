"""Collaborative text: one pycrdt (Yrs) document per entity, one root text per property.

Invariants (ARCHITECTURE.md §5 "Text"):

- Diffs are Yrs updates; applying them is commutative and idempotent, so every replica
  that applies the same set of events ends with identical text, whatever the order.
- The state buffer is the document's full update, **canonical**: integrated in one go into
  a fresh document and encoded again, so replicas holding the same items produce the same
  bytes even when a reused client id let Yrs squash blocks differently. Canonicalising
  costs O(document), so it is lazy: :meth:`TextBackend.deferred_state` returns a
  :class:`~mycelia.proto.Deferred` that computes it only when someone reads the buffer (a
  snapshot for a peer, a dump, a comparison), from the live document if nothing changed
  since, else from the updates logged since the last canonical base. Its parts are that
  base and log, which a durable engine stores instead of the buffer, and
  :meth:`TextBackend.from_parts` takes back as its base and log. The log is compacted once
  it outweighs the base or holds :data:`LOG_PARTS` updates, so a write costs O(diff)
  amortised.
- Every cost of a small local transaction is O(diff): the resident takes its new texts from
  the fork that made the diff (when nothing else was applied between; otherwise, and for
  remote updates, a text is read again when next asked — O(document), as Yrs offers no
  cheaper way to learn what an update changed), a fork takes the resident's *spare*
  document instead of copying the document, and a fork's diff is the Yrs update of its own
  transactions. The spare comes back when the fork's diff is applied to the resident; a
  fork that never commits is simply dropped, and the next fork copies the document once
  (and becomes the spare when it commits).
- The spare is brought up to date only when a fork takes it: an update applied to the
  resident marks it *behind*, and the fork that takes a spare behind applies the
  resident's update since the spare's state vector (one Yrs update: what came between,
  and the delete set). A replica that mostly receives (a subscriber that edits now and
  then) so applies each remote update once, not twice.
- Local edits happen on a fork with its own Yrs client id. A client id must never be used
  by two live forks at once (Yrs would mint two items with one id), so forks draw ids from
  the injected :class:`ClientIds`; a spare keeps the id it was made with and is handed out
  only if that id is free (:meth:`ClientIds.claim`).
- A document made without a :class:`ClientIds` (a resident entity, a decoded state, a
  peer's state being merged) is a *replica*: it applies and merges updates but refuses
  local edits (:class:`~mycelia.errors.TransactionError`), so it needs no client id of its
  own and this module draws no entropy (STYLE.md §3). Its Yrs client id is
  :data:`REPLICA_CLIENT_ID`, which mints nothing.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final, Self

from mycelia.entity.backends import text_canon
from mycelia.entity.backends.client_ids import REPLICA_CLIENT_ID, ClientIds
from mycelia.entity.backends.text_canon import (
    apply_update,
    canonical_update,
    merge_parts,
    merged_updates,
    new_doc,
    root_text,
)
from mycelia.entity.backends.text_offsets import Point, measured, spliced
from mycelia.errors import TransactionError
from mycelia.proto import AdmittedEvent, Deferred

if TYPE_CHECKING:
    from pycrdt import Doc, Subscription, Text, Transaction, TransactionEvent

__all__ = ["REPLICA_CLIENT_ID", "ClientIds", "TextBackend", "canonical_update", "merge_parts"]

COMPACT_MIN: Final = 64 * 1024
"""Logged update bytes tolerated before the log is folded into a new canonical base (at
least the base's own size: compaction is then O(diff) amortised)."""

LOG_PARTS: Final = 1024
"""Logged updates tolerated before the log is folded, whatever their bytes: a durable
engine stores the base and the log (:meth:`TextBackend.deferred_state`), and a reader
applies each, so this bounds what reading a stored text costs beyond its bytes."""

RETURNS_KEPT: Final = 4
"""Forks' documents a resident expects back at once (more concurrent forks just drop)."""


def _new_doc(ids: ClientIds | None) -> Doc[Any]:
    """A document with a fresh client id from ``ids``, or a replica's without ``ids``."""
    return new_doc(REPLICA_CLIENT_ID if ids is None else ids.next())


@dataclass(frozen=True, slots=True)
class _Return:
    """A fork's document, promised back to the entity it was forked from (with its diff)."""

    doc: Doc[Any]
    log: list[bytes]
    """The lender's log when the fork was taken, and its length then."""
    count: int
    texts: dict[str, str]
    """The fork's texts: the lender's once it applies the diff, if nothing came between."""
    names: list[str]


class TextBackend:
    """Text properties of one entity, backed by one Yrs document."""

    name: ClassVar[str] = "text"
    __slots__ = (
        "__weakref__",
        "_base",
        "_canon",
        "_client_id",
        "_doc",
        "_edited",
        "_exact",
        "_lender",
        "_lent_at",
        "_log",
        "_log_bytes",
        "_names",
        "_points",
        "_returned",
        "_returns",
        "_roots_of",
        "_spare",
        "_spare_behind",
        "_texts",
        "_txn",
        "_updates",
        "_version",
        "_watch",
    )

    def __init__(self, doc: Doc[Any], base: bytes | None, *, exact: bool = True) -> None:
        self._doc = doc
        self._client_id = int(doc.client_id)
        self._texts: dict[str, str] = {}
        """Texts read from the document (or known from a fork's edits), as Python strings."""
        self._points: dict[str, Point] = {}
        """Per property, a place in one text: that very ``str`` (a point is used only while
        it is the current text), a character index and its UTF-8 byte offset. An edit
        leaves one just after itself, so the next keystroke's offset costs O(distance), not
        O(document) (:meth:`byte_offset`). Shared with forks: a point names its text."""
        self._names: list[str] | None = None  # the document's root names, once read
        self._roots_of: dict[str, Text] = {}  # root texts, once looked up
        self._base = base  # the state at the start of the log (None: empty)
        self._exact = exact  # whether base and log make this document (a fork's do not)
        self._canon = False  # whether base is canonical and the log empty
        self._log: list[bytes] = []  # updates applied since (append-only; replaced on fold)
        self._log_bytes = 0
        self._version = 0  # bumped by every change (a Deferred knows if it is current)
        self._spare: Doc[Any] | None = None  # a copy for the next fork
        self._spare_behind = False  # whether updates were applied here and not to the spare
        self._returns: dict[bytes, _Return] = {}
        # Fork side:
        self._lender: weakref.ref[TextBackend] | None = None
        self._lent_at: tuple[list[bytes], int] | None = None
        self._watch: Subscription | None = None  # collects this fork's own updates
        self._txn: Transaction | None = None  # the one Yrs transaction of a fork's edits
        self._updates: list[bytes] = []
        self._edited = False  # a deletion does not move the state vector: tracked here
        self._returned = False

    @classmethod
    def empty(cls, ids: ClientIds | None = None) -> Self:
        """No text; local edits on it use a client id from ``ids`` (a replica without)."""
        return cls(_new_doc(ids), None)

    @classmethod
    def from_state(cls, buffer: bytes, ids: ClientIds | None = None) -> Self:
        """Rebuild from a full update (a replica without ``ids``); raises DecodeError if
        malformed."""
        doc = _new_doc(ids)
        apply_update(doc, buffer)
        return cls(doc, buffer)

    @classmethod
    def from_parts(cls, parts: tuple[bytes, ...], ids: ClientIds | None = None) -> Self:
        """Rebuild from a stored buffer's parts (a base, ``b""`` for none, then the updates
        logged since: :meth:`deferred_state`), keeping them as this backend's base and log
        so its next write stays O(diff); raises DecodeError if malformed."""
        doc = _new_doc(ids)
        for part in parts:
            if part:
                apply_update(doc, part)
        backend = cls(doc, parts[0] or None)
        backend._log = list(parts[1:])
        backend._log_bytes = sum(len(p) for p in backend._log)
        return backend

    # -- state --------------------------------------------------------------------------

    def to_state(self) -> bytes:
        """The full document as one update, canonical for its content (O(document))."""
        self._close_edits()
        state = text_canon.canonical(self._doc)
        if not self._edited:
            self._fold(state)
        return state

    def deferred_state(self) -> bytes | Deferred:
        """The state buffer, computed when first read (see the module docstring)."""
        if self._edited:
            return self.to_state()  # local edits are not logged until take_diff
        if self._canon and self._base is not None:
            return self._base  # canonical already, and nothing changed since
        if not self._exact:
            return self.to_state()
        owner = weakref.ref(self)
        version, base, log, count = self._version, self._base, self._log, len(self._log)

        def make() -> bytes:
            backend = owner()
            if backend is not None and backend._version == version:
                return backend.to_state()  # nothing changed since: fold it in, too
            updates = log[:count] if base is None else [base, *log[:count]]
            return canonical_update(updates)

        estimate = (0 if base is None else len(base)) + self._log_bytes
        # (the parts as a function: the log is append-only, so its first ``count`` updates
        # are the ones logged now, and only a durable engine reads them)
        return Deferred(make, estimate=estimate, parts=lambda: (base or b"", *log[:count]))

    def _fold(self, state: bytes) -> None:
        """Make ``state`` (canonical, of the document now) the base of an empty log."""
        self._base = state
        self._log = []
        self._log_bytes = 0
        self._exact = self._canon = True

    def _logged(self, update: bytes) -> None:
        self._version += 1
        self._canon = False
        if not self._exact:
            return
        self._log.append(update)
        self._log_bytes += len(update)
        if len(self._log) > LOG_PARTS or self._log_bytes > max(COMPACT_MIN, len(self._base or b"")):
            self.to_state()

    # -- applying -----------------------------------------------------------------------

    def apply(self, event: AdmittedEvent, diffs: tuple[bytes, ...]) -> set[str]:
        """Apply Yrs updates; returns the text properties they may have changed.

        (Every text root is reported: reading every text to compare costs O(document) per
        event; consumers compare values where it matters, so over-reporting is harmless.)
        """
        for diff in diffs:
            self._integrate(diff)
        return set(self._roots())

    def _integrate(self, update: bytes) -> None:
        """Apply one update here (the spare, if any, is then behind), and log it.

        The texts are read again when next asked (O(document): Yrs offers no cheaper way to
        learn what an update changed) — unless the update is a fork's diff made on exactly
        this document: the fork knows its texts, and its document becomes the spare.
        """
        self._close_edits()
        watch = self._watch
        if watch is not None:  # a fork with edits: this update is not one of them
            self._doc.unobserve(watch)
        at = len(self._log)
        log = self._log
        apply_update(self._doc, update)
        self._logged(update)
        if watch is not None:
            self._watch = self._doc.observe(self._updates_append)
        back = self._returns.pop(update, None)
        if back is not None and back.log is log and back.count == at:
            self._texts = back.texts  # nothing else was applied here since the fork
            self._names = back.names
        else:
            self._texts = {}
            self._names = None
        if self._spare is not None:
            self._spare_behind = True
        elif back is not None:
            self._take_back(back, at)

    def _take_back(self, back: _Return, at: int) -> None:
        """Make a committed fork's document the spare: behind, unless nothing was logged
        between its fork and its own diff, logged at ``at`` (it holds that one)."""
        self._returns.clear()
        self._spare = back.doc
        self._spare_behind = back.log is not self._log or back.count != at

    def _roots(self) -> list[str]:
        names = self._names
        if names is None:
            names = self._names = list(self._doc.keys())
        return names

    def merge(self, other: Self) -> set[str]:
        """Apply the other document's full state (Yrs updates are idempotent)."""
        before = self.values()
        self._integrate(other.to_state())
        after = self.values()
        return {p for p in after if before.get(p) != after[p]}

    # -- forks and local edits ----------------------------------------------------------

    @property
    def client_id(self) -> int:
        """The Yrs client id local edits on this copy are made with."""
        return self._client_id

    @property
    def is_replica(self) -> bool:
        """Whether this copy was made without client ids (it refuses local edits)."""
        return self._client_id == REPLICA_CLIENT_ID

    def fork(self, ids: ClientIds | None = None) -> Self:
        """A copy with a client id from ``ids`` (a replica without): this document's spare
        when it has one whose id is free (O(1), or O(what it is behind)), else a copy
        (O(document))."""
        spare = self._spare
        if spare is not None and ids is not None and ids.claim(int(spare.client_id)):
            self._spare = None
            doc = spare
            if self._spare_behind:  # what came since, by state vector (and the deletes)
                doc.apply_update(self._doc.get_update(doc.get_state()))
        else:
            doc = _new_doc(ids)
            doc.apply_update(self._doc.get_update())
        fork = type(self)(doc, None, exact=False)
        fork._texts = dict(self._texts)
        fork._points = self._points
        fork._names = None if self._names is None else list(self._names)
        if ids is not None:
            fork._lender = weakref.ref(self)
            fork._lent_at = (self._log, len(self._log))
        return fork

    def text(self, prop: str) -> Text:
        """The root text of ``prop`` (created empty on first use); read it, edit through
        :meth:`insert`, :meth:`delete` and :meth:`replace`."""
        text = self._roots_of.get(prop)
        if text is None:
            text = self._roots_of[prop] = root_text(self._doc, prop)
        return text

    def value(self, prop: str) -> str:
        """The text of ``prop`` (empty if it has none), O(1) once read."""
        current = self._texts.get(prop)
        if current is None:
            if prop not in self._roots():
                return ""
            current = self._texts[prop] = str(self.text(prop))
        return current

    def byte_offset(self, prop: str, index: int) -> int:
        """The UTF-8 byte offset of character ``index`` of ``prop``'s text (Yrs counts
        bytes, users characters): ``index`` itself for ASCII, else counted from the last
        point on this very text (:func:`~mycelia.entity.backends.text_offsets.measured`)."""
        current = self.value(prop)
        if current.isascii():
            return index
        point = self._points[prop] = measured(current, index, self._points.get(prop))
        return point[2]

    def insert(self, prop: str, offset: int, text: str, *, at: int | None = None) -> None:
        """Insert ``text`` at UTF-8 byte ``offset`` of ``prop`` (a local edit). ``at`` is
        the same place in characters, if the caller knows it: the cached text of a
        non-ASCII document is then kept current without encoding it again."""
        current = self._begin_edit(prop)
        self.text(prop).insert(offset, text)
        self._edited_text(
            prop, current, offset, offset, text, chars=None if at is None else (at, at)
        )

    def delete(
        self, prop: str, start: int, stop: int, *, chars: tuple[int, int] | None = None
    ) -> None:
        """Delete UTF-8 bytes ``start:stop`` of ``prop`` (a local edit); ``chars`` is the
        same span in characters, if the caller knows it (see :meth:`insert`)."""
        current = self._begin_edit(prop)
        del self.text(prop)[start:stop]
        self._edited_text(prop, current, start, stop, "", chars=chars)

    def replace(self, prop: str, text: str) -> None:
        """Replace the whole of ``prop`` (a local edit, one Yrs transaction)."""
        self._begin_edit(prop)
        target = self.text(prop)
        with self._doc.transaction():
            del target[0 : len(target)]
            target.insert(0, text)
        self._texts[prop] = text

    def _begin_edit(self, prop: str) -> str | None:
        if self.is_replica:
            raise TransactionError(
                "a replica's text takes no local edits: edit a fork made with ClientIds"
            )
        if self._returned:
            raise TransactionError("this fork's edits were committed: fork again to edit")
        if self._watch is None:
            self._watch = self._doc.observe(self._updates_append)
        if self._txn is None:
            # A fork's edits share one Yrs transaction until take_diff: one update, and
            # no per-edit commit (a fork's document is this transaction's alone).
            self._txn = self._doc.transaction()
            self._txn.__enter__()
        self._edited = True
        self._version += 1
        if prop not in self._roots():
            self._names = [*self._roots(), prop]
        return self._texts.get(prop)

    def _close_edits(self) -> None:
        txn = self._txn
        if txn is not None:
            self._txn = None
            txn.__exit__(None, None, None)

    def _updates_append(self, event: TransactionEvent) -> None:
        self._updates.append(bytes(event.update))

    def _edited_text(
        self,
        prop: str,
        current: str | None,
        start: int,
        stop: int,
        text: str,
        *,
        chars: tuple[int, int] | None,
    ) -> None:
        """Keep the cached text of an edited root current (:func:`spliced`)."""
        if current is None:
            self._texts.pop(prop, None)
            return
        self._texts[prop], point = spliced(current, start, stop, text, chars)
        if point is not None:
            self._points[prop] = point

    def take_diff(self) -> bytes | None:
        """The edits since the fork (or the last diff) as one Yrs update, or ``None``.

        On a fork, the diff also promises the document back to the entity it was forked
        from: once that entity applies this diff, the document becomes its spare.
        """
        if not self._edited:
            return None
        self._close_edits()
        updates, self._updates = self._updates, []
        if self._watch is not None:
            self._doc.unobserve(self._watch)
            self._watch = None
        self._edited = False
        diff = updates[0] if len(updates) == 1 else merged_updates(updates)
        self._logged(diff)
        lender = None if self._lender is None else self._lender()
        if lender is not None and self._lent_at is not None:
            log, count = self._lent_at
            returns = lender._returns
            if len(returns) >= RETURNS_KEPT:
                returns.pop(next(iter(returns)))
            returns[diff] = _Return(self._doc, log, count, self._texts, self._roots())
            self._returned = True
        return diff

    def values(self) -> dict[str, object]:
        """Every property's text (roots of other Yrs types, from a newer peer, are skipped)."""
        out: dict[str, object] = {}
        texts = self._texts
        for key in self._roots():
            current = texts.get(key)
            if current is None:
                try:
                    current = texts[key] = str(root_text(self._doc, key))
                except (TypeError, ValueError):
                    continue
            out[key] = current
        return out

    def length(self) -> int:
        """The characters of every property's text, reading none (O(1) per text: what a
        size estimate needs, where :meth:`values` costs O(document) after a remote update)."""
        total = 0
        texts = self._texts
        for key in self._roots():
            current = texts.get(key)
            if current is not None:
                total += len(current)
                continue
            try:
                total += len(root_text(self._doc, key))
            except (TypeError, ValueError):
                continue
        return total

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TextBackend) and self.values() == other.values()

    __hash__ = None  # type: ignore[assignment]
