"""What importing ``mycelia`` loads: a client carries no server side, no progress bars and
no Yrs until it holds a text.

Every module object an import creates is traversed by each full garbage collection for
the life of the process, and its import is paid at every start (ARCHITECTURE §12). Each
case runs a fresh interpreter, since this test process has imported everything already.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import mycelia

LAZY = ("mycelia.node.server", "prometheus_client", "websockets.asyncio.server", "rich", "pycrdt")
"""Modules a process imports only once it uses them."""


def _loaded_after(code: str) -> list[str]:
    """Which of :data:`LAZY` a fresh interpreter holds after running ``code``."""
    listed = f"[m for m in {LAZY!r} if m in sys.modules]"
    report = f"import json, sys\n{code}\nprint(json.dumps({listed}))"
    done = subprocess.run(
        [sys.executable, "-c", report], capture_output=True, text=True, check=True, timeout=120
    )
    loaded: list[str] = json.loads(done.stdout)
    return loaded


def test_a_client_imports_no_server_side_no_progress_bar_and_no_yrs() -> None:
    code = "import mycelia, mycelia.node\nfrom mycelia import Node, connect, Model, Text"
    assert _loaded_after(code) == []


def test_yrs_loads_with_the_first_text_held() -> None:
    code = (
        "import asyncio\n"
        "from mycelia import Model, Node, Text\n"
        "from mycelia.storage import MemoryStorage\n"
        "class Pad(Model, collection='pads'):\n"
        "    body: Text\n"
        "async def main():\n"
        "    node = await Node.open(MemoryStorage(), durable=True)\n"
        "    await node.create_system()\n"
        "    async with node.context().transaction() as trx:\n"
        "        pad = trx.create(Pad, body='hello').id\n"
        "    assert str((await node.context().get(Pad, pad)).body) == 'hello'\n"
        "    await node.close()\n"
        "asyncio.run(main())"
    )
    assert _loaded_after(code) == ["pycrdt"]


def test_the_server_side_loads_when_it_is_first_named() -> None:
    loaded = _loaded_after("from mycelia import Server, serve\nassert callable(serve)")
    assert "mycelia.node.server" in loaded
    assert "prometheus_client" in loaded


def test_a_name_mycelia_does_not_have_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Servr'"):
        _ = mycelia.Servr
