"""A live query the durable peer refuses to mirror says so (mycelia.node.upstream,
mycelia.node.live): before, the refusal was only logged, and the live query stayed open
with what the client held, looking current and never changing again (found by opening
300 live queries from one client against a real server: 44 were refused, silently)."""

from __future__ import annotations

import asyncio

import pytest

from mycelia import Model, Node
from mycelia.errors import InvalidArgument
from mycelia.node import serving
from mycelia.node.inprocess import InProcessServer
from tests.node.waiting import until


class Bulb(Model, collection="bulbs"):
    watts: int = 0


async def test_opening_a_live_query_the_peer_refuses_raises_its_refusal(
    in_process_server: tuple[Node, InProcessServer, Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    server_node, _, client = in_process_server
    monkeypatch.setattr(serving, "MAX_SUBSCRIPTIONS", 2)
    ctx = client.context()
    async with ctx.query(Bulb, "watts > ?", 0) as first, ctx.query(Bulb, "watts > ?", 1):
        with pytest.raises(InvalidArgument, match="at most 2 subscriptions"):
            async with ctx.query(Bulb, "watts > ?", 2):
                pytest.fail("a refused live query was opened")
        async with server_node.context().transaction() as trx:
            trx.create(Bulb, watts=60)

        async def mirrored() -> bool:
            return len(first.items) == 1

        await until(client, mirrored)  # the queries the peer mirrors are unaffected
    assert client.stats().live_queries == 0  # the refused one holds nothing either


async def test_a_live_query_refused_on_a_new_connection_ends_with_the_refusal(
    in_process_server: tuple[Node, InProcessServer, Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every new connection subscribes the open queries again; one the peer now refuses
    ends, and its iteration raises the refusal after the change sets already queued."""
    server_node, server, client = in_process_server
    monkeypatch.setattr(serving, "MAX_SUBSCRIPTIONS", 2)
    ctx = client.context()
    async with ctx.query(Bulb, "watts > ?", 0) as kept, ctx.query(Bulb, "watts > ?", 1) as cut:
        monkeypatch.setattr(serving, "MAX_SUBSCRIPTIONS", 1)
        await server.drop()  # the client redials and subscribes both again, in order
        seen: list[object] = []

        async def drain() -> None:
            async for changes in cut:
                seen.append(changes)  # noqa: PERF401 (each kept as it comes: the loop ends raising)

        with pytest.raises(InvalidArgument, match="at most 1 subscriptions"):
            await asyncio.wait_for(drain(), 10)  # (unended, it would wait for ever)
        assert len(seen) == 1  # its initial result
        async with server_node.context().transaction() as trx:
            trx.create(Bulb, watts=60)

        async def mirrored() -> bool:
            return len(kept.items) == 1

        await until(client, mirrored)
