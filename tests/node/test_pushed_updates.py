"""Pushed updates a subscriber reads while it is applying earlier ones wait, in order, and
are then applied together (mycelia.node.upstream): one ingest, one change set."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Iterable
from typing import Any

import pytest

from mycelia import EntityId, Model, Node
from mycelia.node import upstream
from mycelia.node.inbox import Inboxed, next_step, unplaced
from mycelia.node.inprocess import InProcessServer
from mycelia.node.session import Pushed
from mycelia.proto import DEFAULT_LIMITS
from mycelia.proto.codec import pack
from mycelia.proto.messages import encode_frame
from mycelia.proto.peering import Delta, SubscriptionEnded, SubscriptionUpdate
from mycelia.retrieval import WriteBatch
from mycelia.storage import MemoryStorage
from tests.node.waiting import until


class Item(Model, collection="items"):
    n: int = 0


async def _set(node: Node, entity: EntityId, n: int) -> None:
    async with node.context().transaction() as trx:
        (await trx.edit(Item, entity)).n = n


@contextlib.asynccontextmanager
async def _served() -> AsyncIterator[tuple[Node, Node, EntityId]]:
    """A durable node holding one item, and a client connected to it in process."""
    server_node = await Node.open(MemoryStorage(), durable=True)
    await server_node.create_system()
    async with server_node.context().transaction() as trx:
        entity = trx.create(Item).id
    server = InProcessServer(server_node)
    client = await Node.open(MemoryStorage(), durable=False)
    server.connect(client)
    try:
        await client.wait_ready(timeout=10)
        yield server_node, client, entity
    finally:
        await client.close()
        await server.close()
        await server_node.close()


async def test_updates_read_while_one_is_applied_are_applied_together_in_order() -> None:
    async with _served() as (server_node, client, entity):
        await _applied_together(server_node, client, entity)


async def _applied_together(server_node: Node, client: Node, entity: EntityId) -> None:
    up = client._upstream
    applied: list[int] = []  # events per apply_deltas call
    entered, release, read_all = asyncio.Event(), asyncio.Event(), asyncio.Event()
    apply_deltas = up.apply_deltas

    async def held(deltas: Iterable[Delta]) -> Any:
        deltas = list(deltas)
        applied.append(sum(len(d.events) for d in deltas))
        if len(applied) == 1:
            entered.set()
            await release.wait()  # the first update is slow to apply
        return await apply_deltas(deltas)

    class Inbox(list[Inboxed]):
        def append(self, update: Inboxed) -> None:
            super().append(update)
            if _events_in(self) == 4:  # (the server may push several commits in one update)
                read_all.set()

    async with client.context().query(Item, "") as live:
        assert [v.n for v in live.items] == [0]
        up.apply_deltas = held  # type: ignore[method-assign]
        up._inbox = Inbox()
        await _set(server_node, entity, 1)
        await asyncio.wait_for(entered.wait(), 10)
        for n in range(2, 6):
            await _set(server_node, entity, n)
        await asyncio.wait_for(read_all.wait(), 10)  # 2..5 read, waiting behind 1
        release.set()

        async def shows_5() -> bool:
            return [v.n for v in live.items] == [5]

        await until(client, shows_5)
        assert applied == [1, 4], "the first alone, then the four read meanwhile at once"
        view = await client.context().get(Item, entity)
        assert view.n == 5
        assert len(view.head) == 1


def _events_in(updates: Iterable[Inboxed]) -> int:
    decoded = (u.decode() if isinstance(u, Pushed) else u for u in updates)  # (as read: frames)
    return sum(
        len(d.events) for u in decoded if isinstance(u, SubscriptionUpdate) for d in u.deltas
    )


async def test_every_update_of_a_session_is_applied_by_one_worker_task() -> None:
    async with _served() as (server_node, client, entity):
        await _one_worker(server_node, client, entity)


async def _one_worker(server_node: Node, client: Node, entity: EntityId) -> None:
    up = client._upstream
    workers: list[asyncio.Task[Any] | None] = []
    apply_deltas = up.apply_deltas

    async def noted(deltas: Iterable[Delta]) -> Any:
        workers.append(asyncio.current_task())
        return await apply_deltas(deltas)

    async with client.context().query(Item, "") as live:
        up.apply_deltas = noted  # type: ignore[method-assign]
        for n in range(1, 6):  # each applied before the next is pushed: no batching
            await _set(server_node, entity, n)

            async def shows(n: int = n) -> bool:
                return [v.n for v in live.items] == [n]

            await until(client, shows)
        assert len(workers) == 5
        assert len(set(workers)) == 1, "a task per update costs a subscriber CPU per event"


async def test_a_worker_waiting_for_more_holds_nothing_it_applied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A hundred clients in one process each kept their last step's decoded updates while
    # idle: objects the garbage collector visited on every full collection.
    taken: list[SubscriptionUpdate | SubscriptionEnded] = []

    def noted(inbox: list[Inboxed]) -> list[SubscriptionUpdate | SubscriptionEnded]:
        step = next_step(inbox)
        taken.extend(step)
        return step

    monkeypatch.setattr(upstream, "next_step", noted)
    async with (
        _served() as (server_node, client, entity),
        client.context().query(Item, "") as live,
    ):
        await _set(server_node, entity, 1)

        async def shows_1() -> bool:
            return [v.n for v in live.items] == [1]

        await until(client, shows_1)
        await asyncio.sleep(0)  # (the worker is back waiting for more)
        assert taken
        refs = [sys.getrefcount(taken[i]) for i in range(len(taken))]
        assert refs == [2] * len(taken), "held by taken (and getrefcount's argument) only"


async def test_a_malformed_pushed_update_ends_the_session_and_the_next_one_catches_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with _served() as (server_node, client, entity):
        up = client._upstream
        async with client.context().query(Item, "") as live:
            await _set(server_node, entity, 1)  # (the session's worker is running now)

            async def shows(n: int) -> bool:
                return [v.n for v in live.items] == [n]

            await until(client, lambda: shows(1))
            session = up._link.session
            bad = pack([SubscriptionUpdate.TAG, "not a query id", []])
            assert up.on_update(Pushed(bad, DEFAULT_LIMITS)) is None  # the worker takes it
            await _set(server_node, entity, 2)
            await until(client, lambda: shows(2))
            assert up._link.session is not session, "the session that sent it ended"
            assert "pushed a malformed update" in caplog.text


async def test_a_step_is_a_run_of_event_updates_and_an_update_with_a_state_stands_alone() -> None:
    node = await Node.open(MemoryStorage(), durable=True)
    await node.create_system()
    async with node.context().transaction() as trx:
        entity = trx.create(Item).id
    state = await node.storage.get_state(entity)
    assert state is not None
    (genesis,) = [e.event for e in await node.storage.events_of(entity)]
    await node.close()

    def events(query: int) -> SubscriptionUpdate:
        return SubscriptionUpdate(query, (Delta(entity, "items", True, None, (genesis,)),))

    with_state = SubscriptionUpdate(1, (Delta(entity, "items", True, state, ()),))
    ended = SubscriptionEnded(2, 1, "over")
    read = Pushed(encode_frame(events(2)), DEFAULT_LIMITS)  # as read: decoded when taken
    inbox: list[Inboxed] = [
        events(1), read, with_state, events(1), ended, events(2)
    ]  # fmt: skip
    steps = []
    while inbox:
        steps.append(next_step(inbox))
    assert steps == [
        [events(1), events(2)],  # events of several queries: together
        [with_state],  # a state: alone, after the updates before it
        [events(1)],
        [ended],  # an end: alone, in its place
        [events(2)],
    ]


async def test_a_refused_step_asks_again_only_for_the_entities_it_could_not_place() -> None:
    node = await Node.open(MemoryStorage(), durable=True)
    await node.create_system()
    async with node.context().transaction() as trx:
        placed, other = trx.create(Item).id, trx.create(Item).id
    await _set(node, other, 1)
    (held,) = [e.event for e in await node.storage.events_of(placed)]
    edit = (await node.storage.events_of(other))[-1].event
    await node.storage.write(WriteBatch((), (), (), (other,), {}))  # ``other``: not stored now

    def update(query: int, entity: EntityId, event: Any) -> SubscriptionUpdate:
        return SubscriptionUpdate(query, (Delta(entity, "items", True, None, (event,)),))

    try:
        step = [update(1, placed, held), update(1, other, edit), update(2, placed, held)]
        assert await unplaced(node.storage, step) == {1: {other}}, "only what is not stored"
        assert await unplaced(node.storage, [update(2, placed, held)]) == {2: {placed}}, (
            "a refusal whose events are all stored still asks for its entities"
        )
    finally:
        await node.close()
