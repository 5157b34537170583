"""A closed node lets go of what it held at once: its parts hold one another in cycles, so
whatever they still referenced waited for the collector's next full pass (a closed client
of 1,000 entities left 31,000 objects to it; 245 now)."""

from __future__ import annotations

import asyncio
import gc

import pytest

import mycelia
from mycelia import Model, Node, Server
from mycelia.entity import Entity
from mycelia.errors import StorageError
from mycelia.node.tasks import stop
from mycelia.proto import AdmittedEvent, EventId
from mycelia.storage import MemoryStorage
from mycelia.storage.memory import MEMORY_RECENT_EVENTS


class Item(Model, collection="items"):
    n: int


def alive(kind: type) -> int:
    return sum(type(o) is kind for o in gc.get_objects())


async def test_closing_a_node_frees_its_entities_and_events_without_the_collector() -> None:
    storage = MemoryStorage()
    node = await Node.open(storage, durable=True)
    await node.create_system()
    async with node.context().transaction() as trx:
        for n in range(200):
            trx.create(Item, n=n)
    gc.collect()
    entities, events = alive(Entity), alive(AdmittedEvent)
    assert entities >= 200
    gc.disable()
    try:
        await node.close()
        del node
        assert alive(Entity) <= entities - 200
        assert alive(AdmittedEvent) <= events - min(200, MEMORY_RECENT_EVENTS)  # (decoded)
    finally:
        gc.enable()
    with pytest.raises(StorageError, match="closed"):
        await storage.last_offset()  # a closed store refuses every call, these too
    with pytest.raises(StorageError, match="closed"):
        await storage.event_stored(EventId(bytes(32)))


async def test_stopping_a_task_passes_on_the_callers_own_cancellation() -> None:
    """``stop`` swallows the stopped task's CancelledError, never its caller's: the idiom it
    replaced (``suppress(CancelledError)`` around ``await task``) swallowed both."""
    unwinding, release = asyncio.Event(), asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            unwinding.set()
            await release.wait()  # (its clean-up takes a while)

    task = asyncio.ensure_future(slow_to_stop())
    await asyncio.sleep(0)
    stopping = asyncio.ensure_future(stop(task))
    await asyncio.wait_for(unwinding.wait(), 5)
    stopping.cancel()  # the caller is cancelled while the task unwinds
    with pytest.raises(asyncio.CancelledError):
        await stopping
    release.set()
    await asyncio.wait({task}, timeout=5)
    assert task.cancelled()

    quiet = asyncio.ensure_future(asyncio.Event().wait())
    await asyncio.sleep(0)
    await stop(quiet)  # its own cancellation raises nothing
    assert quiet.cancelled()


async def test_stopping_a_task_raises_what_it_failed_with() -> None:
    async def fails_when_stopped() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise ValueError("broke while stopping") from None

    task = asyncio.ensure_future(fails_when_stopped())
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="broke while stopping"):
        await stop(task)


async def test_a_cancelled_close_is_cancelled_and_still_closes_the_storage(
    server: tuple[Node, Server],
) -> None:
    """Cancelling ``node.close()`` (``asyncio.run``'s shutdown, a TaskGroup, a timeout)
    raises CancelledError in the canceller wherever the close is, and the node's storage is
    closed all the same. (The connection's close swallowed the cancellation in 35 of 40
    tries, and a loop around it never ended.)"""
    _, running = server
    cancelled = 0
    for turns in range(1, 9):  # the cancellation lands at a different point each time
        storage = MemoryStorage()
        client = await Node.open(storage, durable=False)
        await mycelia.connect(client, running.url)
        await client.wait_ready(timeout=10)
        closing = asyncio.ensure_future(client.close())
        for _ in range(turns):
            await asyncio.sleep(0)
        if closing.cancel():  # (a close already over has nothing to cancel)
            cancelled += 1
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(closing, 10)
        with pytest.raises(StorageError, match="closed"):
            await storage.last_offset()
    assert cancelled >= 4  # (a close takes several turns: most land inside it)
