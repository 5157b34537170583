"""Fixtures for node tests: a durable server on real websockets (127.0.0.1, port 0)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

import mycelia
from mycelia import Connection, Node, Server
from mycelia.node.inprocess import InProcessServer
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


@pytest.fixture
async def in_process() -> AsyncIterator[tuple[Node, Node]]:
    """A durable server node and an ephemeral client connected to it in process."""
    server_node = await Node.open(MemoryStorage(), durable=True)
    await server_node.create_system()
    server = InProcessServer(server_node)
    client = await Node.open(MemoryStorage(), durable=False)
    server.connect(client)
    await client.wait_ready(timeout=10)
    yield server_node, client
    await client.close()
    await server.close()
    await server_node.close()
