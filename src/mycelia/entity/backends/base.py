"""The property-backend protocol (ARCHITECTURE.md §5).

A backend holds one kind of property state for one entity and must satisfy the laws the
conformance suite (:mod:`mycelia.entity.backends.testing`) checks:

- **order independence**: applying the same set of events in any causal order gives
  byte-identical state buffers (text: identical content);
- **idempotence**: applying an event twice changes nothing;
- **round trip**: ``from_state(b.to_state())`` is equal to ``b`` (same buffer);
- **provenance**: LWW records which event wrote each value.

Local edits are staged on a forked backend and turned into one diff by :meth:`take_diff`.
"""

from __future__ import annotations

from typing import ClassVar, Protocol, Self

from mycelia.proto import AdmittedEvent

__all__ = ["Backend"]


class Backend(Protocol):
    """One kind of property state for one entity."""

    name: ClassVar[str]
    """The backend's name in event operations and state buffers."""

    @classmethod
    def empty(cls) -> Self:
        """A backend with no properties."""
        ...

    @classmethod
    def from_state(cls, buffer: bytes) -> Self:
        """Rebuild from :meth:`to_state`; raises DecodeError on a malformed buffer."""
        ...

    def to_state(self) -> bytes:
        """The state buffer (canonical where the format allows)."""
        ...

    def apply(self, event: AdmittedEvent, diffs: tuple[bytes, ...]) -> set[str]:
        """Apply ``event``'s diffs for this backend; returns the properties that changed.

        Raises DecodeError for a malformed diff (the caller discards the entity copy).
        """
        ...

    def fork(self) -> Self:
        """An independent copy for a transaction."""
        ...

    def merge(self, other: Self) -> set[str]:
        """Merge another replica's state of this backend (a state-based CRDT join).

        The result is what applying the union of both replicas' events would give.
        Returns the properties whose values changed.
        """
        ...

    def take_diff(self) -> bytes | None:
        """The local edits made on this (forked) copy since the last call, as one diff."""
        ...

    def values(self) -> dict[str, object]:
        """The current value of every property (the queryable view)."""
        ...
