"""A Starlette app serving Mycelia at ``/sync`` beside a route of its own (uvicorn runs it).

Configured by the environment the tests set: ``MYCELIA_DATA`` (an LMDB directory) and
``MYCELIA_TOKEN_PUBLIC_KEY_FILE`` (tokens required, as ``mycelia serve --auth tokens``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute

import mycelia.asgi
from mycelia import Node, TokenAgent
from mycelia.node.tokens import load_public_key
from mycelia.storage.lmdb import LmdbStorage


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    policy = TokenAgent(
        load_public_key(os.environ["MYCELIA_TOKEN_PUBLIC_KEY_FILE"]), require_token=True
    )
    async with Node.open(
        LmdbStorage(os.environ["MYCELIA_DATA"]), durable=True, policy=policy
    ) as node:
        await node.create_system()
        app.state.node = node
        yield
        await endpoint.close()


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("the app's own route\n")


def node() -> Node:
    served: Node = app.state.node
    return served


endpoint = mycelia.asgi.sync_endpoint(node)
app = Starlette(
    routes=[Route("/hello", hello), WebSocketRoute("/sync", endpoint)], lifespan=lifespan
)
