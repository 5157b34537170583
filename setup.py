"""Build Mycelia, compiling its hot path with mypyc where the machine can (ARCHITECTURE.md §13).

The modules named in ``pyproject.toml`` (``[tool.mycelia] compiled``) are compiled to C
extensions that sit beside their sources, and a record of the sources they were built from
(``mycelia/compiled.json``) lets the package tell, when it is imported, whether they still
match (:mod:`mycelia.compiled`). Everything else in the project's metadata is in
``pyproject.toml``.

The build is pure Python, saying why, when:

- ``MYCELIA_PURE_PYTHON=1`` is set;
- mypy (which brings mypyc) is not importable;
- the runtime dependencies are not importable (an isolated build: mypyc type-checks the
  modules against them, so ``make venv`` installs them first, then builds with
  ``pip install --no-build-isolation``);
- mypyc refuses a module, or the C compiler fails (the extensions are optional).

Every build first removes the extensions an earlier one left (one for a module no longer
listed would shadow its source) and keeps none if any failed; a command that builds no
extension (pip's metadata runs, a query such as ``--name``) compiles and removes nothing.
The pure-Python package is the same code, run by the same suite (``make test`` runs it both
ways).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import tomllib
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).parent
RECORD = ROOT / "src" / "mycelia" / "compiled.json"
# What mypyc type-checks the compiled modules against: the runtime dependencies.
NEEDED = ("msgpack", "websockets", "lmdb", "cryptography", "pycrdt", "mypy_extensions")
# The commands that build extensions: any other (pip's metadata runs, ``--name``, sdist)
# neither compiles nor touches an earlier build.
BUILDING = {"build", "build_ext", "bdist_wheel", "editable_wheel", "develop", "install"}
# The shared library mypyc builds the compiled modules into (``src/mycelia__mypyc…``).
GROUP = "mycelia"


def compiled_modules() -> list[str]:
    """The dotted names ``pyproject.toml`` lists for compiling."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(config["tool"]["mycelia"]["compiled"])


def source(module: str) -> Path:
    return ROOT / "src" / (module.replace(".", "/") + ".py")


def why_pure() -> str | None:
    """Why this build cannot compile, or None when it can try."""
    if os.environ.get("MYCELIA_PURE_PYTHON"):
        return "MYCELIA_PURE_PYTHON is set"
    if importlib.util.find_spec("mypyc") is None:
        return "mypy (mypyc) is not installed"
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if missing:
        return (
            f"the runtime dependencies {', '.join(missing)} are not importable here "
            "(an isolated build): install them, then `pip install --no-build-isolation`"
        )
    return None


def command() -> str | None:
    """The setup command this run was asked for (pip's backend asks for one a run)."""
    return next((arg for arg in sys.argv[1:] if not arg.startswith("-")), None)


def remove_previous_build() -> None:
    """Remove every extension an earlier build left in ``src``, and its record: one left
    for a module no longer compiled, or by a build that failed, would shadow its source."""
    RECORD.unlink(missing_ok=True)
    package = ROOT / "src" / "mycelia"
    for suffix in EXTENSION_SUFFIXES:
        for path in [*package.rglob(f"*{suffix}"), *group_library()]:
            path.unlink(missing_ok=True)


def group_library() -> list[Path]:
    """The shared library mypyc built the compiled modules into, if it is there."""
    src = ROOT / "src"
    return [path for s in EXTENSION_SUFFIXES for path in src.glob(f"{GROUP}__mypyc{s}")]


def extensions() -> list[Any]:
    """mypyc's extensions for the hot path, or none (the reason printed)."""
    if command() not in BUILDING:
        return []  # metadata or a query: no C, and an earlier build stays as it is
    remove_previous_build()
    reason = why_pure()
    if reason is not None:
        print(f"mycelia: building pure Python: {reason}", file=sys.stderr)
        return []
    from mypyc.build import mypycify

    modules = compiled_modules()
    try:
        built = mypycify([str(source(m).relative_to(ROOT)) for m in modules], group_name=GROUP)
    except (Exception, SystemExit) as exc:  # mypyc reports a refusal by exiting
        print(f"mycelia: building pure Python: mypyc failed: {exc!r}", file=sys.stderr)
        return []
    for extension in built:
        extension.optional = True  # a C compiler that fails leaves the pure modules
    return built


class BuildExt(build_ext):
    """Builds the extensions, then records the sources they were built from beside them
    (an editable install), which is how :mod:`mycelia.compiled` knows when they are
    stale. If any failed, none is kept: the compiled modules call one another directly
    through their shared library, so they are used all together or not at all."""

    def run(self) -> None:
        super().run()
        if not self.extensions:
            return
        modules = compiled_modules()
        in_place = [beside(m) for m in modules]
        if group_library() and all(path is not None for path in in_place):
            digests = {m: hashlib.sha256(source(m).read_bytes()).hexdigest() for m in modules}
            RECORD.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
            return
        remove_previous_build()
        print("mycelia: the C build failed, so the package is pure Python", file=sys.stderr)


def beside(module: str) -> Path | None:
    """The extension file built in place for ``module``, if there is one."""
    stem = source(module).with_suffix("")
    for suffix in EXTENSION_SUFFIXES:
        path = stem.with_name(stem.name + suffix)
        if path.exists():
            return path
    return None


setup(ext_modules=extensions(), cmdclass={"build_ext": BuildExt})
