"""Run every benchmark: ``python -m benches`` (or one: ``python -m benches proto``)."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import benches


def main() -> None:
    wanted = set(sys.argv[1:])
    for info in sorted(pkgutil.iter_modules(benches.__path__), key=lambda m: m.name):
        if not info.name.startswith("bench_"):
            continue
        if wanted and info.name.removeprefix("bench_") not in wanted:
            continue
        importlib.import_module(f"benches.{info.name}").main()


if __name__ == "__main__":
    main()
