"""Faults injected at the edges: failing storage writes, and a deliberately broken merge rule.

- :class:`FaultyStorage` is a real :class:`~mycelia.storage.MemoryStorage` whose next
  ``write`` can be made to fail with :class:`~mycelia.errors.StorageError` (a disk that
  refuses a write). The failed batch changes nothing (the engine checks a batch before it
  applies it), so the node above must leave no trace of the operation either
  (ARCHITECTURE.md §1 priority 2, §5 step 5).
- :func:`broken_lww` plants a bug on purpose, for the duration of a ``with`` block: LWW
  registers keep the **last applied** write instead of the one with the largest
  (generation, event id). Replicas that apply concurrent writes in different orders then
  diverge, which the invariant checkers must report — a kit that cannot fail is worthless.
  It patches a class attribute of the LWW backend: a test-only fault injection, never for
  production code.

- :func:`dropped_deltas` plants a client-side bug: a client silently ignores some of the
  deltas its durable peer sends (a lost update). Its copy and live queries then fall
  behind for good unless something repairs them, which the checkers must report.
  ``at_most`` bounds the loss: ``dropped_deltas(every=1, at_most=1)`` loses the one next
  update, a gap the client's own repair must cure (``tests/node/test_gaps.py``).

Both replace a method on its class for the block with :func:`_replaced` (``setattr``:
mypy rightly refuses an assignment to a method) and put the original back however the
block ends.

Invariant: outside the ``with`` block (or after :meth:`FaultyStorage.disarm`) behaviour is
exactly the real one.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from mycelia.entity import EntityChange
from mycelia.entity.backends.lww import LwwBackend
from mycelia.errors import StorageError
from mycelia.node.upstream import Upstream
from mycelia.proto import AdmittedEvent
from mycelia.proto.peering import Delta
from mycelia.retrieval import WriteBatch, WriteResult
from mycelia.storage import MemoryStorage

__all__ = ["FaultyStorage", "InjectedFailure", "broken_lww", "dropped_deltas"]


class InjectedFailure(StorageError):
    """The storage write failed because a test asked it to."""


class FaultyStorage(MemoryStorage):
    """A MemoryStorage whose next writes can be made to fail (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.failures_armed = 0
        self.failed = 0
        """Writes refused so far."""

    def arm(self, count: int = 1) -> None:
        """Make the next ``count`` writes raise :class:`InjectedFailure`."""
        self.failures_armed = count

    def disarm(self) -> None:
        """Let writes succeed again."""
        self.failures_armed = 0

    async def write(self, batch: WriteBatch) -> WriteResult:
        """Write the batch, or refuse it whole if a failure is armed."""
        if self.failures_armed:
            self.failures_armed -= 1
            self.failed += 1
            raise InjectedFailure("injected storage failure: the write did not happen")
        return await super().write(batch)


@contextmanager
def broken_lww() -> Iterator[None]:
    """Within the block, LWW keeps the last applied write: replicas diverge (test-only).

    Every write is presented to the real rule with a rank larger than any before it (a
    rising counter instead of its generation), so whatever is applied last wins — without
    touching the backend's internals.
    """
    original = LwwBackend.apply
    ranks = itertools.count(1 << 40)

    def last_applied_wins(
        self: LwwBackend, event: AdmittedEvent, diffs: tuple[bytes, ...]
    ) -> set[str]:
        return original(self, AdmittedEvent(event.event, next(ranks)), diffs)

    with _replaced(LwwBackend, "apply", last_applied_wins):
        yield


@contextmanager
def dropped_deltas(every: int = 5, *, at_most: int | None = None) -> Iterator[None]:
    """Within the block, clients drop every ``every``-th delta their durable peer sends,
    ``at_most`` of them in all (no bound by default), counted over every client from the
    start of the block (test-only: a planted lost-update bug the simulator must catch).

    ``every=1, at_most=1`` drops exactly the first delta any client receives in the block.
    """
    original = Upstream.apply_deltas
    seen = itertools.count(1)
    dropped = 0

    def drop_this_one() -> bool:
        nonlocal dropped
        if next(seen) % every or (at_most is not None and dropped >= at_most):
            return False
        dropped += 1
        return True

    async def lossy(self: Upstream, deltas: Iterable[Delta]) -> list[EntityChange]:
        return await original(self, [d for d in deltas if not drop_this_one()])

    with _replaced(Upstream, "apply_deltas", lossy):
        yield


@contextmanager
def _replaced(owner: type, name: str, replacement: Callable[..., object]) -> Iterator[None]:
    """Within the block, ``owner.name`` is ``replacement``; then the original again.

    Only a method defined on ``owner`` itself can be replaced (KeyError otherwise): putting
    an inherited one back would leave a copy on ``owner`` that hides later changes to it.
    """
    original = owner.__dict__[name]
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)
