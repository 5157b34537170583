"""The compiled hot path and its pure-Python fallback (``mycelia.compiled``, ARCHITECTURE §13).

Each case runs a fresh interpreter: which form of a module runs is decided once, when
``mycelia`` is first imported. The suite as a whole runs on both forms (``make test``);
these tests check that the choice is the one the environment and the build ask for.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import mycelia
from mycelia import compiled

SRC = Path(mycelia.__file__).resolve().parents[1]
RECORD = SRC / "mycelia" / "compiled.json"
BUILT: dict[str, str] = json.loads(RECORD.read_text()) if RECORD.exists() else {}
# CI sets this: a machine that can compile must have compiled, or the "compiled" run of
# the suite would silently be a second pure-Python one.
REQUIRE_ENV = "MYCELIA_REQUIRE_COMPILED"
needs_build = pytest.mark.skipif(
    not BUILT,
    reason="no compiled build here: src/mycelia/compiled.json is missing (mypyc or a C "
    "compiler was not available to `make venv`, or it built with MYCELIA_PURE_PYTHON=1)",
)
REPORT = (
    "import warnings, json\n"
    "with warnings.catch_warnings(record=True) as caught:\n"
    "    warnings.simplefilter('always')\n"
    "    import mycelia, mycelia.node, mycelia.storage\n"
    "from mycelia.compiled import form, loaded\n"
    "print(json.dumps({'loaded': loaded(), 'warnings': [str(w.message) for w in caught],\n"
    "                  'form': [form()]}))\n"
)


def test_a_machine_that_must_compile_has_a_compiled_build() -> None:
    if not os.environ.get(REQUIRE_ENV):
        pytest.skip(f"{REQUIRE_ENV} is not set (CI sets it; a build may be pure Python)")
    assert BUILT, f"{REQUIRE_ENV}=1 but nothing was compiled: read `make venv`'s log"
    config = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert sorted(BUILT) == sorted(config["tool"]["mycelia"]["compiled"])


def report(src: Path, *, pure: bool) -> dict[str, list[str]]:
    """What a fresh interpreter importing ``mycelia`` from ``src`` loads, and warns."""
    env = {k: v for k, v in os.environ.items() if k != compiled.PURE_ENV}
    env["PYTHONPATH"] = str(src)
    if pure:
        env[compiled.PURE_ENV] = "1"
    done = subprocess.run(
        [sys.executable, "-c", REPORT],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, list[str]] = json.loads(done.stdout)
    return result


@needs_build
def test_a_compiled_build_runs_every_module_it_compiled() -> None:
    result = report(SRC, pure=False)
    assert result["loaded"] == sorted(BUILT)
    assert result["warnings"] == []
    assert result["form"] == [f"compiled ({len(BUILT)} modules)"]


@needs_build
def test_the_pure_python_setting_imports_every_module_from_its_source() -> None:
    result = report(SRC, pure=True)
    assert result["loaded"] == []
    assert result["warnings"] == []
    assert result["form"] == [f"pure Python ({compiled.PURE_ENV} is set)"]


@needs_build
def test_an_edited_compiled_module_turns_every_module_to_its_source_and_says_so(
    tmp_path: Path,
) -> None:
    """A checkout edited since its build must not run the old compiled code: all modules
    run as source (they are one library), and the warning names the module and the fix."""
    copy = tmp_path / "src"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    edited = sorted(BUILT)[0]
    source = copy / (edited.replace(".", "/") + ".py")
    source.write_text(source.read_text() + "\n# edited after the build\n")
    assert compiled.stale() == []  # the real tree is not stale
    result = report(copy, pure=False)
    assert result["loaded"] == []
    [message] = result["warnings"]
    assert edited in message
    assert "make venv" in message
    assert result["form"] == ["pure Python (the compiled build is stale: rebuild with `make venv`)"]


@needs_build
def test_a_build_whose_extensions_were_removed_runs_as_source_without_a_warning(
    tmp_path: Path,
) -> None:
    copy = tmp_path / "src"
    shutil.copytree(
        SRC, copy, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.so", "*.pyd")
    )
    result = report(copy, pure=False)
    assert result["loaded"] == []
    assert result["warnings"] == []
    [said] = result["form"]  # what `mycelia serve` logs, with a warning: nothing tells else
    assert said.startswith("pure Python (nothing is compiled here")
    assert "make venv" in said
