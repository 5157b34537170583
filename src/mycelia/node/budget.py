"""Byte budgets: what one connection, and one node, may hold for its peers (ARCHITECTURE.md §7).

Every bound a peer can push on is counted in bytes, has a documented default here
(:class:`Bounds`) and a typed refusal (:class:`~mycelia.errors.Overloaded`):

- **outgoing** (per connection): frames queued for the peer and not yet written, and the
  room answers being built reserved. An answer waits for room, up to
  :attr:`Bounds.stall_timeout`, then cuts the peer off. A pushed update that does not fit
  among the *frames* cuts a slow consumer off at once; room reserved for answers still
  being built (waiting on storage, say) does not count against it, since the peer has
  not been sent those yet and cannot be slow to read them. So a connection holds at most
  twice its budget: its queued frames, and what its answers reserved.
- **incoming** (per connection): bytes of requests read from the peer and not answered
  yet. The reader stops reading while they are over the budget (and while
  :attr:`Bounds.requests_in_flight` requests are), so the peer's own socket fills up.
- **answers** (per node, :class:`Pool`): bytes of answers queued for all peers together.
  An answer takes its bytes from the pool before it is encoded and gives them back once
  written; while the pool is spent, answers wait their turn (first come, first served),
  so many connections cannot each fill their own budget at once.

Invariants: a budget never goes below zero; a single frame larger than a whole budget is
still let through when nothing else is held (it is at most a frame), so a budget can
delay but never wedge a connection; everything taken is given back when the frame is
written or the connection closes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Final

from mycelia.errors import ConnectionClosed

__all__ = [
    "ANSWER_PAGE_BYTES",
    "ANSWER_POOL_BYTES",
    "DEFAULT_BOUNDS",
    "FIRST_PAGE_BYTES",
    "INCOMING_BYTES",
    "OUTGOING_BYTES",
    "PAGE_BYTES",
    "STALL_TIMEOUT",
    "Bounds",
    "Pool",
    "wait_for_room",
]

OUTGOING_BYTES: Final = 8 * 1024 * 1024
"""Bytes queued for one peer before it counts as a slow consumer."""
INCOMING_BYTES: Final = 16 * 1024 * 1024
"""Bytes of one peer's requests read and not answered yet before its reader pauses."""
ANSWER_POOL_BYTES: Final = 32 * 1024 * 1024
"""Bytes of answers queued for all of a node's peers together."""
PAGE_BYTES: Final = 1024 * 1024
"""How much one page of a paged answer aims to carry (an entity larger than that travels
alone in its page; no page exceeds the frame limit)."""
FIRST_PAGE_BYTES: Final = 32 * 1024
"""How much the first page of a deltas answer aims to carry; each next page twice the last,
up to :data:`ANSWER_PAGE_BYTES`. The requester starts on a small first page while the rest
is built."""
ANSWER_PAGE_BYTES: Final = 64 * 1024
"""The most one page of a deltas answer aims to carry (the page size, if smaller): the
requester applies a page while the responder reads and sends the next, so small pages keep
both at work (a fresh client's 1,000 entities: 42 → 34 ms, against pages growing to
1 MiB, where each side waited for the other's large page)."""
STALL_TIMEOUT: Final = 10.0
"""Seconds an answer may wait for room in a peer's outgoing budget *with nothing written
to the peer meanwhile* before the peer is cut off as a slow consumer (a slow reader that
makes progress is never cut off for waiting)."""
REQUESTS_IN_FLIGHT: Final = 64
"""Requests of one peer being answered at once (its reader pauses at this many)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Bounds:
    """The per-connection budgets (see the module docstring); defaults are the constants."""

    outgoing_bytes: int = OUTGOING_BYTES
    incoming_bytes: int = INCOMING_BYTES
    requests_in_flight: int = REQUESTS_IN_FLIGHT
    page_bytes: int = PAGE_BYTES
    stall_timeout: float = STALL_TIMEOUT


DEFAULT_BOUNDS: Final = Bounds()


class Pool:
    """A number of bytes shared by many takers, handed out first come, first served."""

    def __init__(self, limit: int = ANSWER_POOL_BYTES) -> None:
        self.limit = limit
        self.used = 0
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    def try_take(self, size: int) -> bool:
        """Take ``size`` bytes if they fit now (or if nothing is held: one oversized
        taker is let through) and nobody is waiting before us."""
        if self._waiting or not self._fits(size):
            return False
        self.used += size
        return True

    async def take(self, size: int) -> None:
        """Take ``size`` bytes, waiting for them in turn."""
        if self.try_take(size):
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (size, turn)
        self._waiting.append(entry)
        try:
            await turn
        except BaseException:
            if turn.done() and not turn.cancelled():
                self.give(size)  # granted just as we were cancelled: hand it on
            else:
                with contextlib.suppress(ValueError):  # (already passed over by _grant)
                    self._waiting.remove(entry)
                self._grant()
            raise

    def give(self, size: int) -> None:
        """Give back ``size`` bytes taken before (and let waiters in, in turn)."""
        self.used = max(0, self.used - size)
        self._grant()

    def open_up(self) -> None:
        """Let every waiter in now and from now on (the pool's owner is closing)."""
        self.limit = 1 << 62
        self._grant()

    def _fits(self, size: int) -> bool:
        return self.used == 0 or self.used + size <= self.limit

    def _grant(self) -> None:
        while self._waiting and self._fits(self._waiting[0][0]):
            size, turn = self._waiting.popleft()
            if not turn.done():
                self.used += size
                turn.set_result(None)


class Outgoing:
    """One connection's queue of frames to write, counted against its outgoing budget
    and (for answers) the node's :class:`Pool`; see the module docstring."""

    def __init__(self, budget: int, pool: Pool, *, max_frames: int = 1 << 30) -> None:
        self._own = Pool(budget)
        self._max_frames = max_frames
        self._pool = pool
        self._frames: deque[tuple[bytes, int, int]] = deque()
        self._arrived = asyncio.Event()
        self._closed = False
        self._writing = 0
        self._framed = 0
        """Bytes of frames queued or being written (without the room reserved ahead)."""
        self.written_frames = 0
        """Frames written so far (a waiting sender's measure of progress)."""

    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def queued_bytes(self) -> int:
        """Bytes held for the peer now (queued, being written, or reserved)."""
        return self._own.used

    def stuck(self, written_before: int) -> bool:
        """Whether frames are waiting for the peer and none was written since
        :attr:`written_frames` was ``written_before`` (the peer is not reading; waiting
        for the node's pool alone is not the peer's fault)."""
        return self.written_frames == written_before and bool(self._frames or self._writing)

    def offer(self, frame: bytes) -> bool:
        """Queue ``frame`` if it fits the budget now; False if it does not (the caller
        cuts the peer off). A closed queue drops it (True: nothing to do)."""
        if self._closed:
            return True
        size = len(frame)
        if len(self._frames) >= self._max_frames or (
            self._framed and self._framed + size > self._own.limit
        ):
            return False
        self._own.used += size  # counted, so answers wait behind it; see the module docstring
        self._append((frame, size, 0))
        return True

    def force(self, frame: bytes) -> None:
        """Queue ``frame`` whatever the budget (this node's own requests: their callers
        bound them), counting it."""
        if self._closed:
            return
        self._own.used += len(frame)
        self._append((frame, len(frame), 0))

    async def reserve(self, size: int) -> None:
        """Take ``size`` bytes of this connection's budget and of the node's pool ahead of
        building a frame (give them to :meth:`put` as ``reserved``, or back with
        :meth:`unreserve`). Raises ConnectionClosed once the queue is closed (a close wakes
        the senders waiting for room: they must not then take the node's pool)."""
        await self._own.take(size)
        if self.closed():
            self._own.give(size)
            raise ConnectionClosed("the connection closed")
        try:
            await self._pool.take(size)
        except BaseException:
            self._own.give(size)
            raise
        if self.closed():  # closed while waiting for the pool
            self.unreserve(size)
            raise ConnectionClosed("the connection closed")

    def unreserve(self, size: int) -> None:
        """Give back bytes :meth:`reserve` took."""
        self._own.give(size)
        self._pool.give(size)

    async def put(
        self, size: int, encode: Callable[[], bytes], *, slot: list[int] | None = None
    ) -> None:
        """Wait until ``size`` bytes (an upper bound of the frame's) fit this connection's
        budget and the node's pool, then queue ``encode()``: nothing is encoded before
        there is room for it. ``slot[0]`` bytes taken before by :meth:`reserve` count
        towards ``size``: once the room is there this takes them over (``slot[0]`` becomes
        0); if it fails first, they stay in the slot for its owner to give back."""
        held = slot[0] if slot is not None else 0
        if size > held:
            await self.reserve(size - held)
        elif held > size:
            self.unreserve(held - size)
        if slot is not None:
            slot[0] = 0  # in the same step as the reserve's end: nothing is lost between
        self._queue(size, encode)

    def put_now(
        self, size: int, encode: Callable[[], bytes], *, slot: list[int] | None = None
    ) -> bool:
        """:meth:`put` without waiting: queue ``encode()`` if the room is there now and
        nobody waits for it before us; False (nothing taken, nothing encoded) if not."""
        held = slot[0] if slot is not None else 0
        need = size - held
        if need > 0:
            if not self._own.try_take(need):
                return False
            if not self._pool.try_take(need):
                self._own.give(need)
                return False
        elif need < 0:
            self.unreserve(-need)
        if slot is not None:
            slot[0] = 0
        self._queue(size, encode)
        return True

    def _queue(self, size: int, encode: Callable[[], bytes]) -> None:
        """Queue ``encode()``, holding ``size`` bytes of room already taken."""
        try:
            frame = None if self.closed() else encode()
        except BaseException:
            self.unreserve(size)
            raise
        if frame is None:
            self.unreserve(size)
            return
        extra = max(0, len(frame) - size)  # an estimate that fell short: count it all
        self._own.used += extra
        self._pool.used += extra
        self._append((frame, size + extra, size + extra))

    def _append(self, item: tuple[bytes, int, int]) -> None:
        self._frames.append(item)
        self._framed += item[1]
        self._arrived.set()

    async def get(self) -> tuple[bytes, int, int] | None:
        """The next frame to write with what it holds (give it to :meth:`written` once
        written), or None once closed."""
        while not self._frames:
            if self._closed:
                return None
            self._arrived.clear()
            await self._arrived.wait()
        self._writing += 1
        return self._frames.popleft()

    def written(self, item: tuple[bytes, int, int]) -> None:
        """``item`` (from :meth:`get`) left: give back what it held."""
        self._writing = max(0, self._writing - 1)
        self.written_frames += 1
        self._release(item)

    def _release(self, item: tuple[bytes, int, int]) -> None:
        _frame, own, pooled = item
        self._framed -= own
        self._own.give(own)
        if pooled:
            self._pool.give(pooled)

    def close(self, *, drop: bool) -> None:
        """No more frames: the writer ends after the queued ones (all dropped, with what
        they held, if ``drop``)."""
        self._closed = True
        if drop:
            while self._frames:
                self._release(self._frames.popleft())
        self._own.open_up()  # senders waiting for room wake, see the close, and give up
        self._arrived.set()


class InFlight:
    """One connection's requests being answered: how many, and their frames' bytes. The
    reader waits in :meth:`wait_room` while either is at its bound."""

    def __init__(self, *, count: int, size: int) -> None:
        self._max_count = count
        self._max_size = size
        self.count = 0
        self.size = 0
        self._room = asyncio.Event()
        self._room.set()

    async def wait_room(self) -> None:
        """Wait until another request may be read."""
        await self._room.wait()

    def add(self, size: int) -> None:
        """A request of ``size`` bytes was read; it is answered later (:meth:`done`)."""
        self.count += 1
        self.size += size
        if self.count >= self._max_count or self.size >= self._max_size:
            self._room.clear()

    def done(self, size: int) -> None:
        """A request added with ``size`` was answered."""
        self.count = max(0, self.count - 1)
        self.size = max(0, self.size - size)
        if self.count < self._max_count and self.size < self._max_size:
            self._room.set()


async def wait_for_room(
    waiting: Coroutine[object, object, None],
    outgoing: Outgoing,
    *,
    stall_timeout: float,
    gone: Callable[[], bool],
    cut_off: Callable[[str], None],
) -> None:
    """Run ``waiting`` (it waits for room in ``outgoing`` and the node's pool); raises
    ConnectionClosed once the connection is ``gone()``, and cuts the peer off (then
    raises) if it waits ``stall_timeout`` with frames queued for it and none written
    meanwhile. However it ends, ``waiting`` has ended first (its room given back or taken
    over) and its outcome is seen (a close may end it as this is cancelled)."""
    task = asyncio.ensure_future(waiting)
    try:
        while True:
            written = outgoing.written_frames
            await asyncio.wait({task}, timeout=stall_timeout)
            if task.done():
                task.result()
                return
            if gone():
                raise ConnectionClosed("the connection closed")
            if outgoing.stuck(written):
                cut_off(f"nothing was written for {stall_timeout:g} s")
                raise ConnectionClosed("slow consumer: cut off")
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
        if not task.cancelled():
            task.exception()
