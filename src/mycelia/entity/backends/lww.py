"""Last-writer-wins registers: the declarative rule of ARCHITECTURE.md §5.

The rule: a property's value is the one written by the winner among its causally maximal
writers, ordered by ``(generation, event id)``. Because an ancestor always has a smaller
generation than its descendants, the largest ``(generation, event id)`` among *all*
writers of a property is always causally maximal, so the rule reduces to: **keep the
write with the largest (generation, event id)**. That is a pure function of the set of
events, so every delivery order, duplication and batching converges, and applying an
event is O(its diff), with no DAG walk.

Formats (canonical msgpack):

- diff: ``[[property, encoded value], ...]`` sorted by property;
- state buffer: ``[STATE_VERSION, [[property, encoded value, generation, event id], ...]]``
  sorted by property (unknown properties from newer peers are kept like any other).
"""

from __future__ import annotations

from typing import Any, ClassVar, Final, Self, TypeGuard

from mycelia.entity.values import decode_value
from mycelia.errors import DecodeError
from mycelia.proto import AdmittedEvent, EventId
from mycelia.proto.codec import (
    expect_bytes,
    expect_int,
    expect_list,
    expect_name,
    pack,
    unpack,
    valid_names,
)
from mycelia.proto.ids import ID_LENGTH
from mycelia.proto.limits import DEFAULT_LIMITS

__all__ = ["LwwBackend", "state_values"]

STATE_VERSION: Final = 1

# property -> (encoded value, generation, event id)
_Entry = tuple[bytes, int, bytes]


class LwwBackend:
    """LWW registers for one entity."""

    name: ClassVar[str] = "lww"
    __slots__ = ("_decoded", "_entries", "_pending")

    def __init__(self, entries: dict[str, _Entry], pending: dict[str, bytes]) -> None:
        self._entries = entries
        self._pending = pending
        self._decoded: dict[str, object] | None = None  # values(), until the next change

    @classmethod
    def empty(cls) -> Self:
        """No properties."""
        return cls({}, {})

    @classmethod
    def from_state(cls, buffer: bytes) -> Self:
        """Decode a state buffer; raises DecodeError if malformed."""
        return cls(_entries(buffer), {})

    def to_state(self) -> bytes:
        """Canonical state buffer."""
        rows = [[p, *self._entries[p]] for p in sorted(self._entries)]
        return pack([STATE_VERSION, rows])

    def apply(self, event: AdmittedEvent, diffs: tuple[bytes, ...]) -> set[str]:
        """Keep each write whose (generation, event id) beats the stored one."""
        changed: set[str] = set()
        rank = (event.generation, bytes(event.id))
        entries = self._entries
        for diff in diffs:
            for prop, value in decode_diff(diff):
                current = entries.get(prop)
                # Within one event later diffs win (same rank); across events the larger
                # rank wins. Re-applying an event rewrites identical entries: idempotent.
                if current is None or rank >= (current[1], current[2]):
                    if current is None or current[0] != value:
                        changed.add(prop)
                    entries[prop] = (value, rank[0], rank[1])
        decoded = self._decoded
        if decoded is not None:  # keep the decoded view current: decode only what changed
            for prop in changed:
                decoded[prop] = decode_value(entries[prop][0])
        return changed

    def merge(self, other: Self) -> set[str]:
        """Per property, keep the entry with the larger (generation, event id)."""
        changed: set[str] = set()
        entries = self._entries
        for prop, theirs in other._entries.items():
            mine = entries.get(prop)
            if mine is None or (theirs[1], theirs[2]) > (mine[1], mine[2]):
                if mine is None or mine[0] != theirs[0]:
                    changed.add(prop)
                entries[prop] = theirs
        if changed:
            self._decoded = None
        return changed

    def fork(self) -> Self:
        """A copy (entries are immutable tuples, so a shallow copy is independent)."""
        copy = type(self)(dict(self._entries), {})
        copy._decoded = self._decoded  # values are immutable once decoded
        return copy

    def set(self, prop: str, encoded: bytes) -> None:
        """Stage a local write of an encoded value (becomes part of :meth:`take_diff`)."""
        self._pending[prop] = encoded

    def take_diff(self) -> bytes | None:
        """The staged writes as one diff, or ``None`` if there are none."""
        if not self._pending:
            return None
        diff = encode_diff(self._pending)
        self._pending = {}
        return diff

    def encoded(self, prop: str) -> bytes | None:
        """The encoded value of ``prop`` as this copy sees it (staged writes included)."""
        if prop in self._pending:
            return self._pending[prop]
        entry = self._entries.get(prop)
        return None if entry is None else entry[0]

    def writer(self, prop: str) -> tuple[int, EventId] | None:
        """The (generation, event id) that wrote ``prop``'s current value (provenance)."""
        entry = self._entries.get(prop)
        return None if entry is None else (entry[1], EventId(entry[2]))

    def properties(self) -> list[str]:
        """Every property with a value (staged ones included), sorted."""
        return sorted(set(self._entries) | set(self._pending))

    def values(self) -> dict[str, object]:
        """Decoded values of every committed property."""
        if self._decoded is None:
            self._decoded = {p: decode_value(e[0]) for p, e in self._entries.items()}
        return dict(self._decoded)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LwwBackend) and self._entries == other._entries

    __hash__ = None  # type: ignore[assignment]


def state_values(buffer: bytes) -> dict[str, object]:
    """The values a state buffer holds (``from_state(buffer).values()``, without the
    backend); raises DecodeError if malformed. Rows of the common shape are decoded in one
    pass, with no entry built for them (a fresh client adopts a thousand states at once);
    the first other row sends the whole buffer through :func:`_entries`, which checks it
    row by row."""
    version, rows = expect_list(unpack(buffer, what="lww state"), "lww state", length=2)
    if version != STATE_VERSION or type(rows) is not list:
        return {prop: decode_value(entry[0]) for prop, entry in _entries(buffer).items()}
    values: dict[str, object] = {}
    for row in rows:
        if not _plain(row):
            return {prop: decode_value(entry[0]) for prop, entry in _entries(buffer).items()}
        values[row[0]] = decode_value(row[1])
    return values


def _plain(row: object) -> TypeGuard[list[Any]]:
    """Whether a state row has the common shape, checked with no call per field:
    [known name, value bytes, generation ≥ 1, writer id]."""
    return (
        type(row) is list
        and len(row) == 4
        and type(row[0]) is str
        and row[0] in _NAMES
        and type(row[1]) is bytes
        and type(row[2]) is int
        and row[2] >= 1
        and type(row[3]) is bytes
        and len(row[3]) == ID_LENGTH
    )


def _entries(buffer: bytes) -> dict[str, _Entry]:
    """A state buffer's entries; raises DecodeError if malformed."""
    version, rows = expect_list(unpack(buffer, what="lww state"), "lww state", length=2)
    if version != STATE_VERSION:
        raise DecodeError(f"unknown lww state version {version!r}")
    entries: dict[str, _Entry] = {}
    for row in expect_list(rows, "lww entries"):
        if _plain(row):
            entries[row[0]] = (row[1], row[2], row[3])  # the common case
            continue
        prop, value, generation, writer = expect_list(row, "lww entry", length=4)
        entries[_name(prop)] = (
            expect_bytes(value, "value"),
            expect_int(generation, "generation", minimum=1),
            expect_bytes(writer, "writer", length=ID_LENGTH),
        )
    return entries


def encode_diff(writes: dict[str, bytes]) -> bytes:
    """A diff from property → encoded value."""
    return pack([[p, writes[p]] for p in sorted(writes)])


_NAMES: Final = valid_names(DEFAULT_LIMITS)
"""Property names already validated (bounded: see valid_names)."""


def _name(prop: object) -> str:
    """``prop`` as a property name (DecodeError if it is none), remembered once valid."""
    return expect_name(prop, "property")


def decode_diff(diff: bytes) -> list[tuple[str, bytes]]:
    """The (property, encoded value) pairs of a diff; raises DecodeError if malformed."""
    rows = expect_list(unpack(diff, what="lww diff"), "lww diff")
    out = []
    for row in rows:
        if (
            type(row) is list
            and len(row) == 2
            and type(row[0]) is str
            and row[0] in _NAMES
            and type(row[1]) is bytes
        ):
            out.append((row[0], row[1]))  # the common case, already validated once
            continue
        prop, value = expect_list(row, "lww write", length=2)
        out.append((_name(prop), expect_bytes(value, "value")))
    return out
