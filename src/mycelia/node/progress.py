"""Progress of long work, as a person reads it: a bar on a terminal, plain lines otherwise.

Used by ``mycelia dump`` / ``load`` (counts on stderr) and by a client's large initial
sync (a connection's preparation, a live query's first result). Invariants:

- On a terminal (the stream's ``isatty()``) progress is a `rich <https://rich.readthedocs.io>`_
  bar, redrawn in place, left on screen when done.
- Anywhere else (a log file, a pipe, CI) it is whole lines, one at most every ``every``
  seconds, each standing alone (no ``\\r``), and exactly one closing line.
- Reporting costs nothing between lines: :meth:`Progress.update` only stores counts
  unless a line is due (the clock is injected, so tests need no sleeps).
- rich is imported when a bar is first drawn: a process that never shows one (a client
  in a service, a server) neither pays for its import nor carries its objects through
  every full garbage collection.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import IO, TYPE_CHECKING, Final

from mycelia.node.tasks import stop

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID

__all__ = ["EVERY", "SLOW_AFTER", "Progress", "Slow"]

EVERY: Final = 5.0
"""Seconds between plain progress lines."""

SLOW_AFTER = 1.0
"""Seconds sync work runs before its progress is shown (:class:`Slow`)."""


class Progress:
    """One piece of long work's progress (see the module docstring).

    ``write`` takes the plain lines (when ``terminal`` is false); ``stream`` is where a
    terminal bar is drawn. ``total`` (of ``unit``) makes the bar a real fraction; ``bytes``
    as the unit shows sizes.
    """

    def __init__(
        self,
        label: str,
        *,
        unit: str,
        total: int | None = None,
        terminal: bool,
        write: Callable[[str], None],
        stream: IO[str] | None = None,
        every: float = EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.unit = unit
        self.total = total
        self.done = 0
        self.detail = ""
        self._write = write
        self._every = every
        self._clock = clock
        self._started = clock()
        self._last_line = self._started
        self._bar: RichProgress | None = None
        self._task: TaskID | None = None
        if terminal:
            self._bar = _bar(stream, unit=unit, known=total is not None)
            self._task = self._bar.add_task(label, total=total)
            self._bar.start()

    @classmethod
    def on(cls, stream: IO[str], label: str, *, unit: str, total: int | None = None) -> Progress:
        """Progress on ``stream`` (a bar if it is a terminal, else lines printed to it)."""

        def write(line: str) -> None:
            print(line, file=stream, flush=True)

        return cls(
            label, unit=unit, total=total, terminal=stream.isatty(), write=write, stream=stream
        )

    def update(self, done: int, *, detail: str = "") -> None:
        """``done`` of the work is done (``detail``: a few words more, e.g. other counts)."""
        self.done, self.detail = done, detail
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=done, description=self._described())
            return
        now = self._clock()
        if now - self._last_line >= self._every:
            self._last_line = now
            self._write(f"{self._line()} ...")

    def close(self, summary: str | None = None) -> None:
        """End: the bar stays on screen as it is; plain output gets one closing line."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
            return
        self._write(summary or f"{self._line()}, done")

    def _described(self) -> str:
        return f"{self.label} ({self.detail})" if self.detail else self.label

    def _line(self) -> str:
        of = f" of {_amount(self.total, self.unit)}" if self.total is not None else ""
        elapsed = self._clock() - self._started
        detail = f", {self.detail}" if self.detail else ""
        return f"{self.label}: {_amount(self.done, self.unit)}{of}{detail} ({elapsed:.0f} s)"


def _amount(count: int, unit: str) -> str:
    if unit == "bytes":
        return f"{count / 1e6:.1f} MB"
    return f"{count:,} {unit}"


def _bar(stream: IO[str] | None, *, unit: str, known: bool) -> RichProgress:
    from rich.console import Console  # noqa: PLC0415 (only when a bar is drawn: see above)
    from rich.progress import (  # noqa: PLC0415
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.progress import Progress as RichProgress  # noqa: PLC0415

    console = Console(file=stream, stderr=stream is None)
    counted = (
        DownloadColumn()
        if unit == "bytes"
        else MofNCompleteColumn()
        if known
        else TextColumn(f"{{task.completed:,.0f}} {unit}")
    )
    columns = [SpinnerColumn(), TextColumn("{task.description}")]
    if known:
        columns.append(BarColumn())
    return RichProgress(*columns, counted, TimeElapsedColumn(), console=console)


class Slow:
    """Progress for work that may take long, shown only once it has taken ``after`` seconds
    (an ``async with`` block): a client's initial sync.

    ``count`` says how much is done so far (entities received). Once shown: a bar on
    stderr when ``bar`` is true and stderr is a terminal, else a ``log`` line every
    ``every`` seconds; and a closing line either way.
    """

    def __init__(
        self,
        label: str,
        count: Callable[[], int],
        *,
        log: logging.Logger,
        bar: bool,
        unit: str = "entities",
        after: float | None = None,
        every: float = EVERY,
    ) -> None:
        self.label = label
        self._count = count
        self._log = log
        self._bar = bar
        self._unit = unit
        self._after = SLOW_AFTER if after is None else after
        self._every = every
        self._base = 0
        self._started = 0.0
        self._task: asyncio.Task[None] | None = None
        self._progress: Progress | None = None

    @property
    def shown(self) -> bool:
        """Whether the work took long enough to be shown."""
        return self._progress is not None

    async def __aenter__(self) -> Slow:
        loop = asyncio.get_running_loop()
        self._base, self._started = self._count(), loop.time()
        self._task = asyncio.ensure_future(self._tick())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is not None:
            await stop(self._task)
        if self._progress is not None:
            elapsed = asyncio.get_running_loop().time() - self._started
            outcome = "done" if exc_type is None else "cut short"
            self._progress.close(
                f"{self.label}: {self._done():,} {self._unit} in {elapsed:.0f} s, {outcome}"
            )

    def _done(self) -> int:
        return self._count() - self._base

    async def _tick(self) -> None:
        await asyncio.sleep(self._after)
        terminal = self._bar and sys.stderr.isatty()
        loop = asyncio.get_running_loop()
        self._progress = Progress(
            self.label,
            unit=self._unit,
            terminal=terminal,
            write=lambda line: self._log.info("%s", line),
            stream=sys.stderr,
            every=self._every,
            clock=loop.time,
        )
        if not terminal:
            self._log.info("%s: %s %s so far ...", self.label, f"{self._done():,}", self._unit)
        while True:
            await asyncio.sleep(0.2 if terminal else self._every)
            self._progress.update(self._done())
