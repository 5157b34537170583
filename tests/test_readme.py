"""The README's example runs as written (so it cannot rot)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_example_runs_and_prints_what_it_says() -> None:
    text = README.read_text()
    (code,) = re.findall(r"## Two nodes syncing\n\n```python\n(.*?)```", text, re.S)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Parade"


def test_the_quick_start_has_exactly_the_two_commands() -> None:
    text = README.read_text()
    (block,) = re.findall(r"## Quick start\n\n```sh\n(.*?)```", text, re.S)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make serve", "make test"]
