"""Every page runs: docs code blocks, the examples, and no dead reference (issue 17).

``docs/clients.md``'s Python blocks form one module; each ``example_*`` coroutine in it is
run here. Each program in ``examples/`` runs as a user runs it (a subprocess) and prints
what its docstring promises. ARCHITECTURE.md, docs/STYLE.md and the guides name only files
that exist and ``mycelia`` commands the command line has.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import types
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from mycelia.cli.main import build_parser
from mycelia.errors import CODES

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = ROOT / "docs" / "clients.md"
MODULE = "mycelia_clients_guide"


def _guide() -> types.ModuleType:
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    blocks = re.findall(r"```python\n(.*?)```", CLIENTS.read_text(), flags=re.DOTALL)
    module = types.ModuleType(MODULE)
    sys.modules[MODULE] = module  # model classes are looked up by module
    exec(compile("\n".join(blocks), str(CLIENTS), "exec"), module.__dict__)
    return module


GUIDE_EXAMPLES = sorted(
    re.findall(r"^async def (example_\w+)\(", CLIENTS.read_text(), flags=re.MULTILINE)
)


def test_the_client_guide_covers_every_topic() -> None:
    assert (
        sorted(
            [
                "example_connection_state",
                "example_deletion",
                "example_ephemeral_client",
                "example_history",
                "example_live_query",
                "example_local_first_commits",
                "example_offline_from_the_first_run",
                "example_tokens",
            ]
        )
        == GUIDE_EXAMPLES
    )


@pytest.mark.parametrize("name", GUIDE_EXAMPLES)
def test_the_client_guide_example_runs(name: str) -> None:
    example: Callable[[], Coroutine[Any, Any, None]] = getattr(_guide(), name)
    asyncio.run(asyncio.wait_for(example(), 60))


EXAMPLES: dict[str, list[str]] = {
    "todo_two_clients.py": [
        "bob sees: ['buy milk', 'water plants']",
        "ann still has to: ['water plants']",
    ],
    "offline_notes.py": [
        "offline: owed to the server: 2",
        "restarted: still owed: 2",
        "online: owed now: 0",
        "the server holds: ['groceries', 'ideas']",
    ],
    "text_editor.py": ["identical: True"],
    "fastapi_app.py": ["the app's node holds: Prince 1986"],
}


def test_every_example_is_run_here() -> None:
    assert sorted(p.name for p in (ROOT / "examples").glob("*.py")) == sorted(EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_example_runs_and_prints_what_it_says(name: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for expected in EXAMPLES[name]:
        assert expected in lines, done.stdout


PAGES = [
    "ARCHITECTURE.md",
    "README.md",
    "CHANGELOG.md",
    "docs/STYLE.md",
    "docs/clients.md",
    "docs/protocol.md",
]
PATH = re.compile(
    r"(?<![\w/.])((?:src/|tests/|docs/|examples/|benches/)?"
    r"(?:mycelia/)?[\w-]+(?:/[\w-]+)*\.(?:py|md))\b"
)


def _exists(reference: str) -> bool:
    candidates = [
        ROOT / reference,
        ROOT / "src" / reference,
        ROOT / "src" / "mycelia" / reference,
        ROOT / "docs" / reference,
    ]
    return any(path.exists() for path in candidates)


@pytest.mark.parametrize("page", PAGES)
def test_a_page_names_only_files_that_exist(page: str) -> None:
    text = (ROOT / page).read_text()
    named = {m for m in PATH.findall(text) if "/" in m or m.endswith(".md")}
    dead = sorted(reference for reference in named if not _exists(reference))
    assert dead == [], f"{page} names missing files: {dead}"


def test_architecture_names_only_commands_the_command_line_has() -> None:
    parser = build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    commands = set(actions[0].choices)
    text = (ROOT / "ARCHITECTURE.md").read_text() + (ROOT / "README.md").read_text()
    named = set(re.findall(r"`mycelia (\w+)", text))
    assert named <= commands, named - commands


def test_the_protocol_reference_lists_every_error_code() -> None:
    text = (ROOT / "docs" / "protocol.md").read_text()
    listed = {(int(code), name) for code, name in re.findall(r"\| (\d+) \| (\w+)", text)}
    missing = {(code, cls.__name__) for cls, code in CODES.items()} - listed
    assert not missing, f"docs/protocol.md lacks these error codes: {sorted(missing)}"
