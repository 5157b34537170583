"""The simulator's trace: everything that happened, as bytes, hashed as it is recorded.

Each entry is a list of plain values (ints, strings, bytes, lists) packed with the
canonical codec and fed to one SHA-256, length-prefixed, so two traces have the same
:attr:`Trace.digest` exactly when they recorded the same entries in the same order.
Entries hold the bytes that travelled (messages), what each node did with them, every
commit's event ids and, at the end, every node's state buffers: two runs with the same
digest did the same thing, byte for byte.

Invariant: recording never reads a clock or any entropy, and nothing in an entry depends
on hash-table iteration order (the simulator sorts before it records).
"""

from __future__ import annotations

import hashlib

from mycelia.proto.codec import pack

__all__ = ["Trace"]


class Trace:
    """An append-only, hashed record; keeps the entries only when asked (``keep=True``)."""

    def __init__(self, *, keep: bool = False) -> None:
        self._hash = hashlib.sha256()
        self.count = 0
        self.entries: list[tuple[object, ...]] | None = [] if keep else None

    def record(self, *fields: object) -> None:
        """Append one entry (its fields must be packable: ints, str, bytes, lists, None)."""
        data = pack(list(fields))
        self._hash.update(len(data).to_bytes(4, "big"))
        self._hash.update(data)
        self.count += 1
        if self.entries is not None:
            self.entries.append(fields)

    @property
    def digest(self) -> str:
        """The SHA-256 of every entry so far, in hex."""
        return self._hash.hexdigest()

    def lines(self, *, width: int = 160) -> list[str]:
        """The kept entries, one readable line each (bytes abbreviated)."""
        return [_line(entry, width) for entry in self.entries or []]


def _line(entry: tuple[object, ...], width: int) -> str:
    parts = []
    for field in entry:
        if isinstance(field, bytes):
            parts.append(f"<{len(field)} bytes {field[:6].hex()}>")
        else:
            parts.append(str(field))
    text = " ".join(parts)
    return text if len(text) <= width else text[: width - 1] + "…"
