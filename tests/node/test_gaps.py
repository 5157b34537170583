"""A pushed update whose missing parents the durable peer does not send is never left
silently unapplied: the client re-subscribes the query asking for the entity's state
whole, and catches up (mycelia.node.upstream).

Before, the held events waited for good, and the server, believing the client held the
head it pushed, sent nothing more: the W3 run on PostgreSQL ended with a third of its
clients showing other heads than the server, every commit confirmed. Then a
re-subscription with the heads held got a bridge, which could stall on the same missing
history: one W3 client of 200 kept a head lacking a tip of the shared text for good.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from mycelia import Model, Node
from mycelia.node.ports import Peer
from mycelia.node.serving import Responder
from mycelia.proto.messages import Message
from mycelia.proto.peering import EventsResponse, GetEventsRequest, SubscribeRequest
from mycelia.testing import dropped_deltas
from tests.node.waiting import until


class Dial(Model, collection="dials"):
    turn: int = 0


@contextmanager
def events_never_sent() -> Iterator[list[GetEventsRequest]]:
    """Within the block, the durable peer answers every GetEvents with no events (as an
    overloaded one whose answers come too late would); yields the requests it got."""
    original = Responder._get_events
    asked: list[GetEventsRequest] = []

    async def empty(self: Responder, peer: Peer, msg: GetEventsRequest) -> Message:
        asked.append(msg)
        return EventsResponse(msg.request_id, (), ())

    Responder._get_events = empty  # type: ignore[method-assign]
    try:
        yield asked
    finally:
        Responder._get_events = original  # type: ignore[method-assign]


async def test_an_update_the_peer_cannot_fill_resubscribes_for_the_state_and_catches_up(
    in_process: tuple[Node, Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    server_node, client = in_process
    async with server_node.context().transaction() as trx:
        dial = trx.create(Dial).id
    live = await client.context().query(Dial, "").__aenter__()
    try:

        async def shows(turn: int) -> bool:
            return [d.turn for d in live.items] == [turn]

        await until(client, lambda: shows(0))
        subscribed: list[SubscribeRequest] = []
        subscribe = Responder._subscribe

        async def spied(self: Responder, peer: Peer, msg: SubscribeRequest) -> Message:
            subscribed.append(msg)
            return await subscribe(self, peer, msg)

        monkeypatch.setattr(Responder, "_subscribe", spied)
        with events_never_sent() as asked, dropped_deltas(every=1, at_most=1):
            for turn in (1, 2):  # the client loses the first update; the second has a gap
                async with server_node.context().transaction() as trx:
                    (await trx.edit(Dial, dial)).turn = turn
            await until(client, lambda: shows(2))  # re-subscribed: it holds the head
        assert asked  # the gap was asked for, and the answer brought nothing
        assert subscribed[0].known == (), "asked for the state whole, over no head"
        want = (await server_node.context().get(Dial, dial)).head
        assert [d.head for d in live.items] == [want]
    finally:
        await live.close()
