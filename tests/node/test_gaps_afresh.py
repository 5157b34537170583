"""An update the client cannot apply for want of history re-subscribes asking for the
entity's state whole (mycelia.node.upstream): an ephemeral node that holds a snapshot
lacks the events below it, so a bridge could stall on the same gap again (under W3 load
one client of 200 was left for good with a tip of the shared text missing and hundreds
of events held)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import pytest

from mycelia import Model, Node
from mycelia.entity import EntityChange
from mycelia.node.inprocess import InProcessServer
from mycelia.node.ports import Peer
from mycelia.node.serving import Responder
from mycelia.node.upstream import Upstream
from mycelia.proto.messages import Message
from mycelia.proto.peering import Delta, EventsResponse, GetEventsRequest, SubscribeRequest
from mycelia.storage import MemoryStorage
from tests.node.waiting import until

ApplyDeltas = Callable[[Upstream, Iterable[Delta]], Coroutine[Any, Any, list[EntityChange]]]


class Gauge(Model, collection="gauges"):
    level: int = 0


def lose_the_first(apply: ApplyDeltas) -> ApplyDeltas:
    """``Upstream.apply_deltas`` that loses the first delta it is given."""
    lost: list[Delta] = []

    async def lossy(self: Upstream, deltas: Iterable[Delta]) -> list[EntityChange]:
        kept = list(deltas)
        if not lost and kept:
            lost.append(kept.pop(0))
        return await apply(self, kept)

    return lossy


async def test_a_gap_the_peer_does_not_fill_brings_the_entity_s_state_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server_node = await Node.open(MemoryStorage(), durable=True)
    await server_node.create_system()
    server = InProcessServer(server_node)
    client = await Node.open(MemoryStorage(), durable=False)
    server.connect(client)
    await client.wait_ready(timeout=10)
    async with server_node.context().transaction() as trx:
        gauge = trx.create(Gauge).id
    live = await client.context().query(Gauge, "").__aenter__()
    subscribed: list[SubscribeRequest] = []
    subscribe = Responder._subscribe

    async def spied(self: Responder, peer: Peer, msg: SubscribeRequest) -> Message:
        subscribed.append(msg)
        return await subscribe(self, peer, msg)

    async def empty(self: Responder, peer: Peer, msg: GetEventsRequest) -> Message:
        return EventsResponse(msg.request_id, (), ())  # as an overloaded peer's, too late

    try:

        async def shows(level: int) -> bool:
            return [g.level for g in live.items] == [level]

        await until(client, lambda: shows(0))
        monkeypatch.setattr(Responder, "_subscribe", spied)
        monkeypatch.setattr(Responder, "_get_events", empty)
        monkeypatch.setattr(Upstream, "apply_deltas", lose_the_first(Upstream.apply_deltas))
        for level in (1, 2):  # the client loses the first update; the second has a gap
            async with server_node.context().transaction() as trx:
                (await trx.edit(Gauge, gauge)).level = level
        await until(client, lambda: shows(2))
        assert [r.known for r in subscribed] == [()], "re-subscribed without the entity's head"
        want = (await server_node.context().get(Gauge, gauge)).head
        assert [g.head for g in live.items] == [want]
    finally:
        await live.close()
        await client.close()
        await server.close()
        await server_node.close()
