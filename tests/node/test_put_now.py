"""Queueing a frame without waiting (``Outgoing.put_now``): the path of most sends, one
per push. It takes the room only when ``put`` would not have waited for it."""

from __future__ import annotations

import asyncio

from mycelia.node.budget import Outgoing, Pool


async def test_a_frame_with_room_is_queued_at_once_and_counted() -> None:
    pool = Pool(1000)
    out = Outgoing(100, pool)
    assert out.put_now(40, lambda: b"x" * 30)
    assert (out.queued_bytes, pool.used) == (40, 40)
    item = await out.get()
    assert item is not None
    assert item[0] == b"x" * 30
    out.written(item)
    assert (out.queued_bytes, pool.used) == (0, 0)


async def test_without_room_nothing_is_taken_or_encoded() -> None:
    pool = Pool(1000)
    out = Outgoing(100, pool)
    assert out.put_now(80, lambda: b"a")
    encoded: list[int] = []

    def encode() -> bytes:
        encoded.append(1)
        return b"b"

    assert not out.put_now(40, encode), "80 + 40 is beyond the connection's 100"
    assert (out.queued_bytes, pool.used, encoded) == (80, 80, [])
    first = await out.get()
    assert first is not None
    out.written(first)
    assert out.put_now(40, encode), "room again once the first frame was written"
    assert encoded == [1]


async def test_what_the_node_s_pool_lacks_is_not_taken_from_the_connection_either() -> None:
    pool = Pool(100)
    busy, other = Outgoing(1000, pool), Outgoing(1000, pool)
    assert busy.put_now(60, lambda: b"a")
    assert not other.put_now(50, lambda: b"b")
    assert (other.queued_bytes, pool.used) == (0, 60)


async def test_a_sender_waiting_for_the_pool_keeps_its_turn() -> None:
    pool = Pool(100)
    busy, waiter, late = Outgoing(1000, pool), Outgoing(1000, pool), Outgoing(1000, pool)
    assert busy.put_now(95, lambda: b"a")
    waiting = asyncio.ensure_future(waiter.put(50, lambda: b"b"))
    await asyncio.sleep(0)
    assert not late.put_now(1, lambda: b"c"), "it would fit, but another waits before it"
    assert late.queued_bytes == 0
    item = await busy.get()
    assert item is not None
    busy.written(item)
    await asyncio.wait_for(waiting, 5)
    assert (waiter.queued_bytes, pool.used) == (50, 50)


async def test_room_reserved_ahead_is_taken_over_at_once() -> None:
    pool = Pool(1000)
    out = Outgoing(1000, pool)
    await out.reserve(300)
    slot = [300]
    assert out.put_now(120, lambda: b"z" * 120, slot=slot)  # the excess goes back at once
    assert (slot, out.queued_bytes, pool.used) == ([0], 120, 120)
