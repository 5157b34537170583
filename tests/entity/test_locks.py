"""An entity's lock exists only while it is held or waited for (mycelia.entity.locks)."""

from __future__ import annotations

import asyncio

import pytest

from mycelia import Model, Node
from mycelia.entity.locks import EntityLocks
from mycelia.proto import EntityId
from mycelia.storage import MemoryStorage

A, B = EntityId(b"\x01" * 32), EntityId(b"\x02" * 32)


class Tally(Model, collection="tallies"):
    n: int = 0


async def _waiting(locks: EntityLocks, entity_id: EntityId) -> asyncio.Task[None]:
    """A task that waits for ``entity_id``'s lock, once it waits."""
    started = asyncio.Event()

    async def wait() -> None:
        started.set()
        await locks.acquire(entity_id)

    task = asyncio.ensure_future(wait())
    await started.wait()  # the task ran up to the lock, and waits there now
    return task


async def test_a_lock_lives_while_it_is_held_and_goes_with_its_last_user() -> None:
    locks = EntityLocks()
    await locks.acquire(A)
    await locks.acquire(B)
    waiter = await _waiting(locks, A)
    assert len(locks) == 2
    locks.release(B)
    assert len(locks) == 1, "B's lock went with its holder"
    locks.release(A)  # to the waiter, in turn
    await waiter
    assert len(locks) == 1
    locks.release(A)
    assert len(locks) == 0


async def test_a_waiter_cancelled_or_failing_leaves_no_lock_behind() -> None:
    locks = EntityLocks()
    await locks.acquire(A)
    waiter = await _waiting(locks, A)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    locks.release(A)
    assert len(locks) == 0
    await locks.acquire(A)
    handed = await _waiting(locks, A)
    then = await _waiting(locks, A)
    locks.release(A)  # handed to the first waiter, which is cancelled before it runs
    handed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await handed
    await then  # it passed the lock on
    locks.release(A)
    assert len(locks) == 0
    with pytest.raises(RuntimeError):
        async with locks.held(A):
            raise RuntimeError("the body failed")
    assert len(locks) == 0


async def test_a_waiter_cancelled_just_before_a_release_passes_it_by_and_raises_cancelled() -> None:
    """The release passes over a waiter cancelled in the same step (its turn is done), and
    drops it from the queue: the waiter then found its turn gone and raised ValueError,
    not CancelledError (seen in the soak: a client's update applier died of it)."""
    locks = EntityLocks()
    await locks.acquire(A)
    cancelled = await _waiting(locks, A)
    then = await _waiting(locks, A)
    cancelled.cancel()
    locks.release(A)  # before the cancelled waiter runs: to the next one
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await then
    locks.release(A)
    assert len(locks) == 0
    await locks.acquire(B)
    alone = await _waiting(locks, B)
    alone.cancel()
    locks.release(B)  # nobody left waiting: the lock goes
    with pytest.raises(asyncio.CancelledError):
        await alone
    assert len(locks) == 0


async def test_a_node_that_changed_a_thousand_entities_holds_no_lock_for_them() -> None:
    node = await Node.open(MemoryStorage(), durable=True)
    await node.create_system()
    try:
        for n in range(1000):
            async with node.context().transaction() as trx:
                trx.create(Tally, n=n)
        assert len(node._applier.locks) == 0  # before: 1,001 locks, kept for ever
    finally:
        await node.close()
