"""Run every benchmark: ``python -m benches`` (or some: ``python -m benches proto entity``)."""

from __future__ import annotations

import argparse
import importlib
import pkgutil

import benches


def main() -> None:
    names = sorted(
        info.name.removeprefix("bench_")
        for info in pkgutil.iter_modules(benches.__path__)
        if info.name.startswith("bench_")
    )
    parser = argparse.ArgumentParser(
        description="Run the benchmarks, each with its default sizes (python -m "
        "benches.bench_NAME --help shows one's own options)."
    )
    parser.add_argument(
        "names", nargs="*", metavar="NAME",
        help=f"benchmarks to run (default: all), of {', '.join(names)}",
    )  # fmt: skip
    wanted = parser.parse_args().names
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        parser.error(f"no benchmark called {', '.join(unknown)}: choose from {', '.join(names)}")
    for name in wanted or names:
        importlib.import_module(f"benches.bench_{name}").main([])


if __name__ == "__main__":
    main()
