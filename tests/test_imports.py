"""What importing ``mycelia`` loads: a client carries no server side and no progress bars.

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

SERVER_SIDE = ("mycelia.node.server", "prometheus_client", "websockets.asyncio.server", "rich")


def _loaded_after(code: str) -> list[str]:
    """Which of :data:`SERVER_SIDE` a fresh interpreter holds after running ``code``."""
    listed = f"[m for m in {SERVER_SIDE!r} if m in sys.modules]"
    report = f"import json, sys\n{code}\nprint(json.dumps({listed}))"
    done = subprocess.run(
        [sys.executable, "-c", report], capture_output=True, text=True, check=True, timeout=120
    )
    loaded: list[str] = json.loads(done.stdout)
    return loaded


def test_a_client_imports_no_server_side_and_no_progress_bar() -> None:
    code = "import mycelia, mycelia.node\nfrom mycelia import Node, connect, Model, Text"
    assert _loaded_after(code) == []


def test_the_server_side_loads_when_it_is_first_named() -> None:
    loaded = _loaded_after("from mycelia import Server, serve\nassert callable(serve)")
    assert "mycelia.node.server" in loaded
    assert "prometheus_client" in loaded


def test_a_name_mycelia_does_not_have_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Servr'"):
        _ = mycelia.Servr
