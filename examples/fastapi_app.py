"""Mycelia mounted in a FastAPI app, served by uvicorn (run: python examples/fastapi_app.py).

``mycelia.asgi.sync_endpoint(node)`` is a plain ASGI websocket endpoint: add it as a
websocket route beside the app's own routes, and clients connect to ``ws://HOST:PORT/sync``
(``pip install mycelia[asgi] fastapi``). Without FastAPI installed this runs on Starlette,
which FastAPI is built on: the calls below are the same in both.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.routing import WebSocketRoute

import mycelia
import mycelia.asgi
from mycelia import Model, Node
from mycelia.storage import MemoryStorage

try:
    from fastapi import FastAPI as App
except ImportError:  # FastAPI is Starlette underneath: the same calls work
    from starlette.applications import Starlette as App  # type: ignore[assignment]


class Album(Model, collection="albums"):
    artist: str
    year: int


@contextlib.asynccontextmanager
async def lifespan(app: Any) -> AsyncIterator[None]:
    async with Node.open(MemoryStorage(), durable=True) as node:  # LmdbStorage in production
        await node.create_system()
        app.state.node = node
        yield
        await endpoint.close()  # drain the sync connections before the node closes


app = App(lifespan=lifespan)
endpoint = mycelia.asgi.sync_endpoint(lambda: app.state.node)
app.router.routes.append(WebSocketRoute("/sync", endpoint))  # FastAPI's router is Starlette's


async def main() -> None:
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    serving = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    async with Node.open(MemoryStorage(), durable=False) as client:
        await mycelia.connect(client, f"ws://127.0.0.1:{port}/sync")
        await client.wait_ready(timeout=10)
        async with client.context().transaction() as trx:  # returns once the app's node has it
            album = trx.create(Album, artist="Prince", year=1986)
        held = await app.state.node.context().get(Album, album.id)
        print("the app's node holds:", held.artist, held.year)
    server.should_exit = True
    await serving


if __name__ == "__main__":
    asyncio.run(main())
