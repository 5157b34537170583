"""Virtual time for simulations: an asyncio event loop whose clock jumps (ARCHITECTURE.md §12).

:class:`VirtualTimeLoop` runs ready callbacks as any loop does; when none is ready it moves
its clock straight to the next timer instead of waiting for it. So ``asyncio.sleep``,
timeouts, backoff and every delay a simulated network draws cost no wall time, and a run
is a pure function of its inputs: nothing reads the wall clock.

Invariants:

- ``loop.time()`` starts at 0 and only moves forward, to exactly the next timer's time,
  when nothing else can run;
- nothing in a simulation does real I/O (memory storage, simulated transports); a loop
  with no ready callback and no timer cannot make progress, and raises :class:`Deadlock`
  rather than hang.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

__all__ = ["Deadlock", "VirtualTimeLoop", "run_virtual"]

T = TypeVar("T")
_FileObject = Any  # selectors' own alias is private: an int fd or an object with fileno()


class Deadlock(RuntimeError):
    """Everything waits and no timer is set: the simulation cannot make progress."""


class _Selector(selectors.BaseSelector):
    """Registers file objects (the loop's own self-pipe) but never waits on them."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._loop = loop
        self._keys: dict[int, selectors.SelectorKey] = {}

    def register(
        self, fileobj: _FileObject, events: int, data: Any = None
    ) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else int(fileobj.fileno())
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj: _FileObject) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else int(fileobj.fileno())
        return self._keys.pop(fd)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise Deadlock("every task waits and no timer is set: the simulation is stuck")
        self._loop.advance(timeout)
        return []

    def get_map(self) -> Mapping[_FileObject, selectors.SelectorKey]:
        return {key.fileobj: key for key in self._keys.values()}

    def close(self) -> None:
        self._keys.clear()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time (see the module docstring)."""

    def __init__(self) -> None:
        self._virtual_now = 0.0
        super().__init__(_Selector(self))

    def time(self) -> float:
        """The virtual time: seconds since the loop started, as the simulation counts."""
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        """Move the clock forward (the selector calls this when nothing is ready)."""
        if seconds > 0:
            self._virtual_now += seconds


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a new :class:`VirtualTimeLoop` (then close it)."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(coro)
