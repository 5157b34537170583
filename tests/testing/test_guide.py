"""docs/testing-guide.md runs: its Python code blocks form one module, whose tests pass.

The guide's code is extracted and executed here, so the worked example cannot drift from
the API it documents.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

GUIDE = Path(__file__).parents[2] / "docs" / "testing-guide.md"
MODULE = "mycelia_testing_guide_example"


def _guide() -> Any:
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.DOTALL)
    module = types.ModuleType(MODULE)
    sys.modules[MODULE] = module  # hypothesis and pickling look classes up by module
    exec(compile("\n".join(blocks), str(GUIDE), "exec"), module.__dict__)
    return module


def test_the_guide_has_the_four_worked_examples() -> None:
    guide = _guide()
    for name in (
        "test_albums_converge_in_any_delivery_order",
        "test_albums_converge_under_faults",
        "TestAlbumMachine",
        "test_my_suite_catches_a_broken_merge_rule",
    ):
        assert hasattr(guide, name), name


def test_guide_example_strategies() -> None:
    _guide().test_albums_converge_in_any_delivery_order()


def test_guide_example_simulator() -> None:
    _guide().test_albums_converge_under_faults()


def test_guide_example_state_machine() -> None:
    _guide().TestAlbumMachine("runTest").runTest()


def test_guide_example_planted_bug() -> None:
    _guide().test_my_suite_catches_a_broken_merge_rule()
