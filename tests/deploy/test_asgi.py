"""The ASGI endpoint: its transport against a fake ASGI server, and a real Starlette app
under uvicorn serving its own route beside ``/sync`` (the peering tests themselves run
on uvicorn through ``auth_server`` in test_auth.py)."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from mycelia import Node
from mycelia.asgi import AsgiTransport, sync_endpoint
from mycelia.errors import ConnectionClosed, PayloadTooLarge, RemoteProtocolError
from mycelia.storage import MemoryStorage
from tests.deploy.conftest import Issuer
from tests.deploy.servers import Served, start_uvicorn


class FakeAsgi:
    """The ASGI server's side of one websocket: messages in, messages out."""

    def __init__(self, *incoming: dict[str, object]) -> None:
        self.incoming: asyncio.Queue[dict[str, object]] = asyncio.Queue()
        for message in incoming:
            self.incoming.put_nowait(message)
        self.sent: list[dict[str, object]] = []

    async def receive(self) -> dict[str, object]:
        return await self.incoming.get()

    async def send(self, message: dict[str, object]) -> None:
        if self.sent and self.sent[-1]["type"] == "websocket.close":
            raise RuntimeError("Unexpected ASGI message 'websocket.send' after close")
        self.sent.append(message)


def transport(fake: FakeAsgi, limit: int = 100) -> AsgiTransport:
    scope = {"type": "websocket", "client": ("10.1.2.3", 4567)}
    return AsgiTransport(scope, fake.receive, fake.send, max_frame_bytes=limit)  # type: ignore[arg-type]


async def test_the_transport_carries_binary_frames_both_ways() -> None:
    fake = FakeAsgi({"type": "websocket.receive", "bytes": b"in"})
    ws = transport(fake)
    assert ws.remote == "10.1.2.3:4567"
    assert await ws.recv() == b"in"
    await ws.send(b"out")
    assert fake.sent == [{"type": "websocket.send", "bytes": b"out"}]


async def test_a_text_frame_is_a_protocol_error() -> None:
    ws = transport(FakeAsgi({"type": "websocket.receive", "text": "hello"}))
    with pytest.raises(RemoteProtocolError, match="text frames"):
        await ws.recv()


async def test_a_frame_over_the_limit_closes_with_1009() -> None:
    fake = FakeAsgi({"type": "websocket.receive", "bytes": bytes(101)})
    with pytest.raises(PayloadTooLarge):
        await transport(fake).recv()
    assert fake.sent == [{"type": "websocket.close", "code": 1009, "reason": "frame too large"}]


async def test_after_a_disconnect_every_call_raises_connection_closed() -> None:
    ws = transport(FakeAsgi({"type": "websocket.disconnect", "code": 1001}))
    with pytest.raises(ConnectionClosed, match="1001"):
        await ws.recv()
    with pytest.raises(ConnectionClosed):
        await ws.recv()
    with pytest.raises(ConnectionClosed):
        await ws.send(b"late")
    await ws.close()  # idempotent, sends nothing more


async def test_plain_http_to_the_endpoint_is_told_to_upgrade() -> None:
    node = await Node.open(MemoryStorage(), durable=True)
    fake = FakeAsgi()
    await sync_endpoint(node)({"type": "http"}, fake.receive, fake.send)  # type: ignore[arg-type]
    assert fake.sent[0]["status"] == 426
    await node.close()


@pytest.fixture(scope="module")
def app(issuer: Issuer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = start_uvicorn(tmp_path_factory.mktemp("app"), public_key_file=issuer.public_file)
    yield served
    served.stop()


def test_the_app_serves_its_own_routes_beside_sync(app: Served) -> None:
    with urllib.request.urlopen(app.http + "/hello", timeout=10) as response:
        assert response.read() == b"the app's own route\n"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(app.http + "/sync", timeout=10)
    refused.value.close()
    assert refused.value.code == 404  # Starlette routes plain HTTP past a WebSocketRoute
