"""A load's staging area: what :meth:`StorageEngine.load` will write, held outside the
store until the engine commits it whole (ARCHITECTURE.md §6, "load is all or nothing").

Invariants:

- A :class:`Spill` is an **unlinked** temporary file (``tempfile.TemporaryFile``), made in
  the directory it is given (an LMDB store's own directory: the staging area sits next to
  the target) or the system's temporary directory, so a crash mid-load leaves nothing.
- Items are msgpack values, read back in the order they were appended, as many times as
  the commit needs (LMDB re-reads them after growing its map); memory holds one item at a
  time, whatever the size of the load.
- :func:`load_batches` turns a dump stream into write batches of about ``batch_events``
  events, each entity's state in the batch of (or a batch after) its last events, so the
  staged batches replay in an order in which no state precedes an event it names.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterable, AsyncIterator, Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Final

import msgpack

from mycelia.errors import StorageError
from mycelia.proto import AdmittedEvent
from mycelia.retrieval import StoredState, WriteBatch
from mycelia.storage.engine import DumpRecord, MetaRecord

__all__ = ["BATCH_EVENTS", "Spill", "load_batches", "stale_load"]

BATCH_EVENTS: Final = 1000
"""About how many events (or states) one staged batch holds."""


class Spill:
    """An append-only, re-readable sequence of msgpack values in an unlinked file."""

    def __init__(self, directory: Path | None = None) -> None:
        self._directory = directory
        self._file: IO[bytes] | None = None
        self._packer = msgpack.Packer(use_bin_type=True)

    def __enter__(self) -> Spill:
        try:
            self._file = tempfile.TemporaryFile(dir=self._directory)
        except OSError as exc:
            where = self._directory or tempfile.gettempdir()
            raise StorageError(f"cannot make a staging file in {where}: {exc}") from exc
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def append(self, item: object) -> None:
        """Add ``item`` at the end (raises StorageError if the disk refuses it)."""
        assert self._file is not None, "a Spill is used inside its with block"
        try:
            self._file.seek(0, 2)
            self._file.write(self._packer.pack(item))
        except OSError as exc:
            raise StorageError(f"cannot write the load's staging file: {exc}") from exc

    def items(self) -> Iterator[object]:
        """Every item, in order (each call reads the file again from its start)."""
        assert self._file is not None, "a Spill is used inside its with block"
        self._file.flush()
        self._file.seek(0)
        unpacker = msgpack.Unpacker(self._file, raw=False, max_buffer_size=1 << 31)
        yield from unpacker


async def load_batches(
    records: AsyncIterable[DumpRecord], *, batch_events: int = BATCH_EVENTS
) -> AsyncIterator[WriteBatch]:
    """The records as write batches (see the module docstring); meta goes with the first."""
    events: list[AdmittedEvent] = []
    states: list[StoredState] = []
    meta: list[tuple[str, bytes | None]] = []
    async for record in records:
        if isinstance(record, MetaRecord):
            meta.append((record.key, record.value))
            continue
        events.extend(record.events)
        if record.state is not None:
            states.append(record.state)
        if len(events) >= batch_events or len(states) >= batch_events:
            yield WriteBatch(tuple(events), tuple(states), tuple(meta))
            events, states, meta = [], [], []
    if events or states or meta:
        yield WriteBatch(tuple(events), tuple(states), tuple(meta))


def stale_load(expected: int, found: int) -> StorageError:
    """The error for a load whose store was written while it was being staged."""
    return StorageError(
        f"the store was written during the load (its change feed moved from offset "
        f"{expected} to {found}): nothing was loaded; stop the nodes writing to it and load "
        "again"
    )
