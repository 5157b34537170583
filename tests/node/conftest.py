"""Fixtures for node tests: a durable server on real websockets (127.0.0.1, port 0)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

import mycelia
from mycelia import Connection, Node, Server
from mycelia.storage import MemoryStorage

NodeFactory = Callable[..., Awaitable[tuple[Node, Connection]]]


@pytest.fixture
async def server() -> AsyncIterator[tuple[Node, Server]]:
    node = await Node.open(MemoryStorage(), durable=True)
    await node.create_system()
    running = await mycelia.serve(node, host="127.0.0.1", port=0)
    yield node, running
    await running.close()
    await node.close()


@pytest.fixture
async def client(server: tuple[Node, Server]) -> AsyncIterator[NodeFactory]:
    """Make ephemeral client nodes connected to the server (closed at the end)."""
    made: list[Node] = []

    async def make(**kwargs: object) -> tuple[Node, Connection]:
        storage = kwargs.pop("storage", None) or MemoryStorage()
        node = await Node.open(storage, durable=False)  # type: ignore[arg-type]
        made.append(node)
        connection = await mycelia.connect(node, f"ws://127.0.0.1:{server[1].port}", **kwargs)  # type: ignore[arg-type]
        await node.wait_ready(timeout=10)
        return node, connection

    yield make
    for node in made:
        await node.close()
