"""Fixtures for node tests: a durable server on real websockets (127.0.0.1, port 0)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

import mycelia
from mycelia import Connection, Node, Server
from mycelia.entity import Snapshot
from mycelia.errors import PolicyDenied
from mycelia.node import PermissiveAgent
from mycelia.node.inprocess import InProcessServer
from mycelia.node.policy import Credentials
from mycelia.proto import AdmittedEvent
from mycelia.storage import MemoryStorage

NodeFactory = Callable[..., Awaitable[tuple[Node, Connection]]]


class RefusesTitle(PermissiveAgent):
    """Refuses any write that leaves a document titled ``refused``."""

    def check_event(
        self, credentials: Credentials, before: Snapshot, after: Snapshot, event: AdmittedEvent
    ) -> None:
        if after.values.get("title") == "refused":
            raise PolicyDenied("documents may not be titled 'refused'")


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    """A durable node on MemoryStorage, with its system."""
    node = await Node.open(MemoryStorage(), durable=True)
    await node.create_system()
    yield node
    await node.close()


@pytest.fixture
async def served() -> AsyncIterator[InProcessServer]:
    """A durable node served in process, whose policy refuses the title ``refused``."""
    node = await Node.open(MemoryStorage(), durable=True, policy=RefusesTitle())
    await node.create_system()
    server = InProcessServer(node)
    yield server
    await server.close()
    await node.close()


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
async def in_process_server() -> AsyncIterator[tuple[Node, InProcessServer, Node]]:
    """A durable server node, its in-process server, and an ephemeral client connected."""
    server_node = await Node.open(MemoryStorage(), durable=True)
    await server_node.create_system()
    server = InProcessServer(server_node)
    client = await Node.open(MemoryStorage(), durable=False)
    server.connect(client)
    await client.wait_ready(timeout=10)
    yield server_node, server, client
    await client.close()
    await server.close()
    await server_node.close()


@pytest.fixture
def in_process(in_process_server: tuple[Node, InProcessServer, Node]) -> tuple[Node, Node]:
    """A durable server node and an ephemeral client connected to it in process."""
    server_node, _, client = in_process_server
    return server_node, client
