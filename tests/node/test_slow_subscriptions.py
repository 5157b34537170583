"""A subscription the durable peer does not answer in time is asked again on a new
session (mycelia.node.upstream): before, the timeout was taken as the session ending, but
the session went on, so the live query stayed open with what the client held, looking
current and never mirrored (found by 30 clients opening a `LIMIT` query each against a real
server busy for 30 s: the last ones opened empty and stayed empty)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from mycelia import Model, Node
from mycelia.node.inprocess import InProcessServer
from mycelia.storage import MemoryStorage
from tests.node.waiting import until


class Lamp(Model, collection="lamps"):
    lumens: int = 0


async def test_a_subscription_answered_too_late_is_asked_again_on_a_new_session(
    in_process_server: tuple[Node, InProcessServer, Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    server_node, server, _ = in_process_server
    async with server_node.context().transaction() as trx:
        trx.create(Lamp, lumens=800)
    storage = server_node.storage
    fetch: Callable[..., Any] = storage.fetch
    stalled, release = asyncio.Event(), asyncio.Event()

    async def first_fetch_stalls(*args: Any, **kwargs: Any) -> Any:
        if not stalled.is_set():
            stalled.set()
            await release.wait()  # the peer's first answer never comes in time
        return await fetch(*args, **kwargs)

    monkeypatch.setattr(storage, "fetch", first_fetch_stalls)
    async with Node.open(MemoryStorage(), durable=False) as client:
        server.connect(client, request_timeout=0.2)
        await client.wait_ready(timeout=10)
        async with client.context().query(Lamp, "lumens > ?", 0) as live:
            assert stalled.is_set()
            release.set()

            async def mirrored() -> bool:
                return [lamp.lumens for lamp in live.items] == [800]

            await until(client, mirrored)  # (before: never, for the session went on)
