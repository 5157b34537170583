"""A backend this version does not know, kept so nothing from a newer peer is lost.

Its diffs are remembered with their writer's rank and replayed into the state buffer in
rank order, so the buffer is order independent and a later version that knows the
backend can rebuild the real state from it (or from the stored events).
"""

from __future__ import annotations

from typing import ClassVar, Self

from mycelia.proto import AdmittedEvent
from mycelia.proto.codec import expect_bytes, expect_int, expect_list, pack, unpack

__all__ = ["OpaqueBackend"]


class OpaqueBackend:
    """Diffs of an unknown backend, kept in (generation, event id, index) order."""

    name: ClassVar[str] = "opaque"
    __slots__ = ("_records",)

    def __init__(self, records: dict[tuple[int, bytes, int], bytes]) -> None:
        self._records = records

    @classmethod
    def empty(cls) -> Self:
        """Nothing kept."""
        return cls({})

    @classmethod
    def from_state(cls, buffer: bytes) -> Self:
        """Decode the kept records; raises DecodeError if malformed."""
        records = {}
        for row in expect_list(unpack(buffer, what="opaque state"), "opaque records"):
            gen, eid, index, diff = expect_list(row, "opaque record", length=4)
            key = (
                expect_int(gen, "generation"),
                expect_bytes(eid, "event id"),
                expect_int(index, "i"),
            )
            records[key] = expect_bytes(diff, "diff")
        return cls(records)

    def to_state(self) -> bytes:
        """Records in rank order."""
        return pack([[*k, self._records[k]] for k in sorted(self._records)])

    def apply(self, event: AdmittedEvent, diffs: tuple[bytes, ...]) -> set[str]:
        """Remember the diffs (no property can be read from them here)."""
        for i, diff in enumerate(diffs):
            self._records[(event.generation, bytes(event.id), i)] = diff
        return set()

    def merge(self, other: Self) -> set[str]:
        """Union of the kept records."""
        self._records.update(other._records)
        return set()

    def fork(self) -> Self:
        """A copy."""
        return type(self)(dict(self._records))

    def take_diff(self) -> bytes | None:
        """Unknown backends are never edited locally."""
        return None

    def values(self) -> dict[str, object]:
        """Nothing is readable."""
        return {}
