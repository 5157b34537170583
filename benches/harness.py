"""Timing and table helpers shared by the benchmarks.

Machines here are noisy: every figure is a median over interleaved rounds, and targets are
stated as ratios to primitives measured in the same run (ARCHITECTURE.md §13).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final

QUICK: Final = ("--quick", "small sizes: a smoke test of the benchmark, not its figures")
"""The ``--quick`` flag most benchmarks take."""


def options(
    doc: str | None, argv: Sequence[str] | None, *flags: tuple[str, str]
) -> argparse.Namespace:
    """A benchmark's command line: ``--help`` shows the first paragraph of its docstring
    (``doc``) and every one of its ``flags`` (name, help: each a switch), parsed from
    ``argv`` (the process's arguments when ``None``)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0] if doc else None)
    for name, text in flags:
        parser.add_argument(name, action="store_true", help=text)
    return parser.parse_args(list(argv) if argv is not None else sys.argv[1:])


def per_call(fn: Callable[[], object], *, number: int, rounds: int = 7) -> float:
    """Median seconds per call of ``fn`` over ``rounds`` rounds of ``number`` calls."""
    samples = []
    for _ in range(rounds):
        gc.disable()
        start = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - start) / number)
        gc.enable()
    return statistics.median(samples)


def interleaved(
    fns: dict[str, Callable[[], object]], *, number: int, rounds: int = 9
) -> dict[str, float]:
    """Median seconds per call of each function, measured round-robin so noise hits all."""
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            gc.disable()
            start = time.perf_counter()
            for _ in range(number):
                fn()
            samples[name].append((time.perf_counter() - start) / number)
            gc.enable()
    return {k: statistics.median(v) for k, v in samples.items()}


def run_async(factory: Callable[[], Awaitable[float]], *, rounds: int = 5) -> float:
    """Median of ``rounds`` runs of an async measurement that returns seconds."""
    return statistics.median(asyncio.run(_call(factory)) for _ in range(rounds))


async def _call(factory: Callable[[], Awaitable[float]]) -> float:
    return await factory()


def fmt_time(seconds: float) -> str:
    """A human unit for a duration."""
    if seconds < 1e-6:
        return f"{seconds * 1e9:.0f} ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


@dataclass
class Table:
    """A benchmark table printed with the command that produced it."""

    title: str
    columns: Sequence[str]
    rows: Sequence[Sequence[str]]

    def print(self) -> None:
        """Print as a Markdown table, preceded by the command line."""
        command = " ".join(["python", "-m", *_module_argv()])
        print(f"\n### {self.title}\n\n`{command}`\n")
        widths = [
            max(len(str(c)), *(len(str(r[i])) for r in self.rows)) if self.rows else len(c)
            for i, c in enumerate(self.columns)
        ]
        line = "| " + " | ".join(c.ljust(w) for c, w in zip(self.columns, widths, strict=True))
        print(line + " |")
        print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
        for row in self.rows:
            cells = (str(c).ljust(w) for c, w in zip(row, widths, strict=True))
            print("| " + " | ".join(cells) + " |")
        sys.stdout.flush()


def _module_argv() -> list[str]:
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    name = spec.name if spec is not None else sys.argv[0]
    return [name.removesuffix(".__main__"), *sys.argv[1:]]


def verdict(ok: bool) -> str:
    """The pass/miss cell of a target column."""
    return "✓" if ok else "MISS"
