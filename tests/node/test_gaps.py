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

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from mycelia import Model, Node
from mycelia.node.inprocess import InProcessServer
from mycelia.node.ports import Peer
from mycelia.node.serving import Responder
from mycelia.proto.messages import Message
from mycelia.proto.peering import (
    EventsResponse,
    GetEventsRequest,
    KnownEntity,
    SubscribeRequest,
)
from mycelia.storage import MemoryStorage
from mycelia.testing import dropped_deltas
from tests.node.waiting import until


class Dial(Model, collection="dials"):
    turn: int = 0


@contextmanager
def events_never_sent(at_most: int | None = None) -> Iterator[list[GetEventsRequest]]:
    """Within the block, the durable peer answers GetEvents with no events (as an
    overloaded one whose answers come too late would), the first ``at_most`` of them
    (all by default); yields the requests it answered so."""
    original = Responder._get_events
    asked: list[GetEventsRequest] = []

    async def empty(self: Responder, peer: Peer, msg: GetEventsRequest) -> Message:
        if at_most is not None and len(asked) >= at_most:
            return await original(self, peer, msg)
        asked.append(msg)
        return EventsResponse(msg.request_id, (), ())

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Responder, "_get_events", empty)
        yield asked


def subscriptions_seen(monkeypatch: pytest.MonkeyPatch) -> list[SubscribeRequest]:
    """From now on (for the test), the Subscribe requests the durable peer answers."""
    seen: list[SubscribeRequest] = []
    subscribe = Responder._subscribe

    async def spied(self: Responder, peer: Peer, msg: SubscribeRequest) -> None:
        seen.append(msg)
        await subscribe(self, peer, msg)

    monkeypatch.setattr(Responder, "_subscribe", spied)
    return seen


async def test_an_update_the_peer_cannot_fill_resubscribes_for_the_state_and_catches_up(
    in_process: tuple[Node, Node],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server_node, client = in_process
    caplog.set_level(logging.INFO, "mycelia.node.upstream")
    async with server_node.context().transaction() as trx:
        dial = trx.create(Dial).id
    live = await client.context().query(Dial, "").__aenter__()
    try:

        async def shows(turn: int) -> bool:
            return [d.turn for d in live.items] == [turn]

        await until(client, lambda: shows(0))
        subscribed = subscriptions_seen(monkeypatch)
        with events_never_sent() as asked, dropped_deltas(every=1, at_most=1):
            for turn in (1, 2):  # the client loses the first update; the second has a gap
                async with server_node.context().transaction() as trx:
                    (await trx.edit(Dial, dial)).turn = turn
            await until(client, lambda: shows(2))  # re-subscribed: it holds the head
        assert asked  # the gap was asked for, and the answer brought nothing
        assert subscribed[0].known == (KnownEntity(dial, ()),), "asked for the state whole"
        want = (await server_node.context().get(Dial, dial)).head
        assert [d.head for d in live.items] == [want]
        said = [(r.levelname, r.getMessage()) for r in caplog.records]
        unapplied = [level for level, text in said if text.startswith("could not apply")]
        # History not here yet, healed as designed: said, not warned of (a contended soak
        # warned so 160 times in 26 s).
        assert unapplied
        assert set(unapplied) == {"INFO"}
    finally:
        await live.close()


async def test_an_entity_asked_for_afresh_that_left_the_query_leaves_it(
    in_process: tuple[Node, Node],
) -> None:
    # Asked for afresh, an entity was named with no head at all: when it no longer matched,
    # the answer did not mention it, and the live query showed it as it was, for good.
    server_node, client = in_process
    async with server_node.context().transaction() as trx:
        dial = trx.create(Dial).id
    async with client.context().query(Dial, "turn < ?", 2) as live:
        assert [d.turn for d in live.items] == [0]
        with events_never_sent(), dropped_deltas(every=1, at_most=1):
            for turn in (1, 2):  # the client loses the first update; the second has a gap
                async with server_node.context().transaction() as trx:
                    (await trx.edit(Dial, dial)).turn = turn  # (2: out of the query)
            changes = aiter(live)
            while live.items:
                await asyncio.wait_for(anext(changes), 10)  # (before: never)
    assert (await client.context().get(Dial, dial)).turn == 2


async def test_a_subscription_answer_bridging_below_the_snapshot_held_asks_for_the_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server_node = await Node.open(MemoryStorage(), durable=True)
    await server_node.create_system()
    fork = await Node.open(MemoryStorage(), durable=True)
    await fork.join_system(await server_node.system_events())
    async with server_node.context().transaction() as trx:
        dial = trx.create(Dial).id  # C
    await fork.ingest(await server_node.storage.events_of(dial))
    server = InProcessServer(server_node)
    client = await Node.open(MemoryStorage(), durable=False)
    server.connect(client)
    live = await client.context().query(Dial, "").__aenter__()  # C, as a state
    try:
        async with server_node.context().transaction() as trx:
            (await trx.edit(Dial, dial)).turn = 1  # A on C: pushed as an event

        async def shows_a() -> bool:
            return [d.turn for d in live.items] == [1]

        await until(client, shows_a)
        await server.stop()
        async with fork.context().transaction() as trx:
            (await trx.edit(Dial, dial)).turn = 2  # B on C, concurrent with A
        await server_node.ingest((await fork.storage.events_of(dial))[-1:])
        want = (await server_node.context().get(Dial, dial)).head
        assert len(want) == 2
        subscribed = subscriptions_seen(monkeypatch)

        async def merged() -> bool:
            return [d.head for d in live.items] == [want]

        with events_never_sent(at_most=1) as asked:  # B's parent C is not sent at first
            server.start()  # the client redials and subscribes with [A]: a bridge to B
            await until(client, merged)
        assert asked  # B could not be placed
        tips = [[len(k.head) for k in s.known] for s in subscribed]
        assert tips == [[1], [0]], "asked again for the state whole (named, with no head)"
    finally:
        await live.close()
        await client.close()
        await server.close()
        await fork.close()
        await server_node.close()
