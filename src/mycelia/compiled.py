"""Which form of the hot path runs: compiled by mypyc, or pure Python (ARCHITECTURE.md §13).

``setup.py`` compiles the modules ``pyproject.toml`` lists (``[tool.mycelia] compiled``)
where the build can, beside their sources, and records the sources it compiled in
``compiled.json``. Python imports an extension ahead of a source of the same name, so this
module, run first by the package's ``__init__``, decides which form is imported:

- ``MYCELIA_PURE_PYTHON=1`` in the environment: every module is imported from its source
  (how the suite tests the fallback, and how a profiler sees every function);
- a compiled module whose source has changed since the build (an edited checkout): the
  extensions are all stale or all of a piece with the stale one (mypyc compiles them as
  one library that calls itself directly), so every module is imported from its source,
  with a :class:`RuntimeWarning` that says how to rebuild;
- otherwise the extensions, where they exist.

The choice is all or nothing: a compiled module never runs beside the source of another.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import warnings
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import (
    EXTENSION_SUFFIXES,
    SOURCE_SUFFIXES,
    ExtensionFileLoader,
    FileFinder,
    ModuleSpec,
    SourceFileLoader,
)
from pathlib import Path
from types import ModuleType
from typing import Final

__all__ = ["PURE_ENV", "asked_pure", "choose", "form", "loaded", "stale"]

PURE_ENV: Final = "MYCELIA_PURE_PYTHON"
_PACKAGE: Final = Path(__file__).parent
_RECORD: Final = _PACKAGE / "compiled.json"


class _SourcesOnly(MetaPathFinder):
    """Finds ``mycelia``'s submodules as sources (or their bytecode), never extensions."""

    def __init__(self) -> None:
        self._finders: dict[str, FileFinder] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if path is None or not fullname.startswith("mycelia."):
            return None
        for entry in path:
            finder = self._finders.get(entry)
            if finder is None:
                finder = self._finders[entry] = FileFinder(
                    entry, (SourceFileLoader, SOURCE_SUFFIXES)
                )
            spec = finder.find_spec(fullname, target)
            if spec is not None and spec.loader is not None:
                return spec
        return None


def stale() -> list[str]:
    """The compiled modules (built, their extension in place) whose source differs from
    the one they were built from."""
    try:
        built: dict[str, str] = json.loads(_RECORD.read_text())
    except FileNotFoundError:
        return []  # nothing was compiled
    root = _PACKAGE.parent
    changed = []
    for module, digest in sorted(built.items()):
        stem = root / module.replace(".", "/")
        if not any(stem.with_name(stem.name + suffix).exists() for suffix in EXTENSION_SUFFIXES):
            continue  # the C build failed or was cleaned away: the source runs
        source = stem.with_suffix(".py")
        try:
            current = hashlib.sha256(source.read_bytes()).hexdigest()
        except FileNotFoundError:
            current = ""
        if current != digest:
            changed.append(module)
    return changed


def choose() -> None:
    """Import sources only if asked to, or if the compiled modules are stale (see above)."""
    if os.environ.get(PURE_ENV):
        _prefer_sources()
        return
    changed = stale()
    if changed:
        warnings.warn(
            f"mycelia: {', '.join(changed)} changed since the hot path was compiled, so "
            f"every module runs as pure Python; rebuild with `make venv` (or "
            f"`pip install --no-build-isolation -e .`), or set {PURE_ENV}=1 to say so",
            RuntimeWarning,
            stacklevel=3,
        )
        _prefer_sources()


def _prefer_sources() -> None:
    if not any(isinstance(f, _SourcesOnly) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourcesOnly())


def loaded() -> list[str]:
    """The ``mycelia`` modules imported so far that are compiled extensions."""
    return sorted(
        name
        for name, module in list(sys.modules.items())
        if name.startswith("mycelia.")
        and isinstance(getattr(module, "__loader__", None), ExtensionFileLoader)
    )


def asked_pure() -> bool:
    """Whether the environment asks for pure Python (``MYCELIA_PURE_PYTHON``)."""
    return bool(os.environ.get(PURE_ENV))


def form() -> str:
    """How the hot path runs, in words for a log line: compiled, or pure Python and why
    (asked for, a stale build, or nothing compiled here). Call once ``mycelia.node`` is
    imported (the hot path is imported with it)."""
    modules = loaded()
    if modules:
        return f"compiled ({len(modules)} modules)"
    if asked_pure():
        return f"pure Python ({PURE_ENV} is set)"
    if stale():
        return "pure Python (the compiled build is stale: rebuild with `make venv`)"
    return (
        "pure Python (nothing is compiled here: `make venv` compiles the hot path where "
        "mypy and a C compiler are installed)"
    )
