"""The parts of an ephemeral node's commit pipeline (:mod:`mycelia.node.commits`): a commit's
handle, the window of commits in flight on a session, and the gate a revert closes.

Invariants:

- A :class:`Pending` outcome is settled once (the first verdict wins) and always marked
  retrieved, so a commit nobody waits for never makes asyncio warn.
- A :class:`Flight` holds at most :data:`WINDOW` commits and :data:`FLIGHT_BYTES` of their
  events (a larger commit goes alone), sent in at most :data:`FRAMES` frames not answered
  yet; every slot taken is given back exactly once, by :meth:`Flight.pop` or
  :meth:`Flight.release`, and a frame's once its answer (or failure) is in. Commits are
  confirmed oldest first, each once: by the Ack's callback, or by the confirmer (or a
  revert) for an answer that is no Ack.
- :func:`verdicts` gives each commit of a frame its own answer, in order: the frame's
  verdict for it, or the frame's failure.
- :meth:`Gate.exclusive` waits until no :meth:`Gate.shared` holder is left, and admits no
  new one meanwhile: a revert never runs beside a local commit.
- :func:`answered` never cancels the answer it waits for, and gives up only on a silent
  peer or after :data:`BUSY_ROUNDS` timeouts of a busy one; :class:`Lateness` is the
  same rule for the confirmer, which waits on no answer.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Final

from mycelia.errors import MyceliaError, RemoteError, RemoteProtocolError, code_of, remote
from mycelia.node.budget import Pool
from mycelia.node.outbox import Owed
from mycelia.proto.messages import Message
from mycelia.proto.peering import Ack, VerdictsResponse

__all__ = [
    "BUSY_ROUNDS",
    "DONE",
    "FLIGHT_BYTES",
    "FRAMES",
    "WINDOW",
    "Flight",
    "Gate",
    "Lateness",
    "Pending",
    "SessionOver",
    "answered",
    "answers_each",
    "either",
    "verdicts",
]

WINDOW: Final = 128
"""Most commits in flight to the durable peer at once."""
FRAMES: Final = 2
"""Most commit frames in flight to the durable peer at once: commits made while they are
not answered wait, and go together in the next frame (one request, one verdict frame)."""
FLIGHT_BYTES: Final = 16 * 1024 * 1024
"""Most bytes of events in flight to the durable peer at once (what the peer reads of one
connection before it stops reading: ``mycelia.node.budget.INCOMING_BYTES``)."""


class _Done:
    """The handle of a commit that needs no confirmation (durable here, or a no-op)."""

    def done(self) -> bool:
        return True

    async def confirmed(self) -> None:
        return None

    async def settled(self) -> None:
        return None


DONE: Final = _Done()


class SessionOver:
    """Whether the pipeline's session with the durable peer is over, as a future that a
    :class:`Pending` waits on beside its own outcome: with ``asyncio.wait``, which adds and
    removes its callbacks and never cancels it (awaiting it directly would: a cancelled
    waiter cancels what it awaits, for every other waiter too)."""

    __slots__ = ("future",)

    def __init__(self) -> None:
        self.future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.future.set_result(None)  # no session yet

    def begin(self) -> None:
        """A session is open (a new future if the last one is over)."""
        if self.future.done():
            self.future = asyncio.get_running_loop().create_future()

    def end(self) -> None:
        """The session is over: its waiters stop waiting."""
        if not self.future.done():
            self.future.set_result(None)


class Pending:
    """One owed commit and its waiters (the :class:`~mycelia.node.ports.Commit` handle).

    ``settled`` waits for the verdict while ``ready()`` says a session is open, and no
    longer than until ``over`` (the pipeline's) says it ended. It waits on both futures at
    once, with no task of its own: a ``wait="peer"`` commit used to start two tasks and a
    gather to learn which came first."""

    __slots__ = ("_future", "_over", "_ready", "owed")

    def __init__(self, owed: Owed, *, ready: Callable[[], bool], over: SessionOver) -> None:
        self.owed = owed
        self._ready = ready
        self._over = over
        self._future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._future.add_done_callback(_retrieve)

    def done(self) -> bool:
        return self._future.done()

    async def confirmed(self) -> None:
        await asyncio.shield(self._future)

    async def settled(self) -> None:
        if not self._future.done() and self._ready():
            both = (self._future, self._over.future)
            await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
        if self._future.done():
            self._future.result()

    def outcome(self) -> Awaitable[None]:
        """The commit's outcome, to wait on without cancelling it."""
        return asyncio.shield(self._future)

    def succeed(self) -> None:
        if not self._future.done():
            self._future.set_result(None)
        # The peer holds the events now: a handle kept for its outcome (an editor keeps
        # thousands) need not hold them too.
        self.owed = Owed(self.owed.seq, ())

    def fail(self, error: MyceliaError) -> None:
        if not self._future.done():
            self._future.set_exception(error)


BUSY_ROUNDS: Final = 10
"""Timeouts an answer may take while the peer keeps sending frames (alive and busy),
before it is given up as stuck on it."""


async def answered(
    future: asyncio.Future[Any], frames_read: Callable[[], int], timeout: float
) -> str | None:
    """Wait for ``future`` without cancelling it: ``None`` once it is done, else why it is
    late: nothing read from the peer for a whole ``timeout``, or :data:`BUSY_ROUNDS`
    timeouts passed while the peer kept sending (a loaded peer answers late)."""
    if future.done():
        return None  # (pipelined commits' answers come in bursts: most are in already)
    heard = frames_read()
    for _ in range(BUSY_ROUNDS):
        await asyncio.wait({future}, timeout=timeout)
        if future.done():
            return None
        now = frames_read()
        if now == heard:
            return f"no answer in {timeout:g} s with nothing heard meanwhile"
        heard = now
    return None if future.done() else f"no answer in {BUSY_ROUNDS} timeouts of {timeout:g} s"


async def either(first: Awaitable[object], second: Awaitable[object]) -> None:
    """Wait until one of two awaitables is done (the other is cancelled)."""
    tasks: list[asyncio.Future[Any]] = [asyncio.ensure_future(first), asyncio.ensure_future(second)]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark an outcome seen: nobody need wait for it (asyncio would warn)."""
    if not future.cancelled():
        future.exception()


class Gate:
    """Local commits share it; a revert takes it alone, after those in progress finish."""

    def __init__(self) -> None:
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._open = asyncio.Event()
        self._open.set()

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        await self._open.wait()
        self._active += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._active -= 1
            if not self._active:
                self._idle.set()

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        self._open.clear()
        try:
            await self._idle.wait()
            yield
        finally:
            self._open.set()


class Flight:
    """The commits in flight on one session, oldest first: at most WINDOW of them and
    :data:`FLIGHT_BYTES` of their events (one larger commit goes alone).

    An Ack is taken where it arrives: the answer's callback confirms the oldest commits
    whose Acks are in (``confirm``), in order, so a confirmed commit wakes no task but
    its waiters. Any other answer at the front (a refusal, "not now", a closed connection)
    sets :attr:`attention` for the confirmer. Neither happens while ``paused()``: a revert
    takes every answer itself."""

    def __init__(
        self,
        confirm: Callable[[Pending], None] = lambda _: None,
        *,
        paused: Callable[[], bool] = lambda: False,
    ) -> None:
        self._items: deque[tuple[Pending, asyncio.Future[Message]]] = deque()
        self._sizes: deque[int] = deque()
        self._room = Pool(WINDOW)  # commits, counted one each
        self._bytes = Pool(FLIGHT_BYTES)
        self._frames = Pool(FRAMES)  # frames, counted one each
        self._confirm = confirm
        self._paused = paused
        self.attention = asyncio.Event()
        """Set when the oldest commit's answer is in and is no Ack: the confirmer's turn."""

    async def frame(self) -> None:
        """Wait until fewer than :data:`FRAMES` frames are unanswered, and take a place;
        :meth:`sent` (or :meth:`unsent`) gives it back."""
        await self._frames.take(1)

    def try_frame(self) -> bool:
        """Take a place for a frame if one is free now (as :meth:`frame`, not waiting)."""
        return self._frames.try_take(1)

    def sent(self, answer: asyncio.Future[Message]) -> None:
        """The frame whose place was taken is sent: its place is back once ``answer`` is."""
        answer.add_done_callback(lambda _: self._frames.give(1))

    def unsent(self) -> None:
        """The frame whose place was taken was not sent after all."""
        self._frames.give(1)

    async def slot(self, size: int) -> None:
        """Wait for a slot for a commit of ``size`` bytes, and take it."""
        await self._room.take(1)
        try:
            await self._bytes.take(size)
        except BaseException:
            self._room.give(1)
            raise

    def try_slot(self, size: int) -> bool:
        """Take a slot for a commit of ``size`` bytes if one is free now."""
        if not self._room.try_take(1):
            return False
        if not self._bytes.try_take(size):
            self._room.give(1)
            return False
        return True

    def add(self, pending: Pending, future: asyncio.Future[Message], size: int) -> None:
        self._items.append((pending, future))
        self._sizes.append(size)
        future.add_done_callback(self._answered)

    def _answered(self, _: asyncio.Future[Message]) -> None:
        if self._paused():
            return
        items = self._items
        while items:
            pending, future = items[0]
            if not future.done():
                return
            if not _acked(future):
                self.attention.set()
                return
            self.pop()
            self._confirm(pending)

    async def unacked(
        self, timeout: float, lateness: Lateness
    ) -> tuple[Pending, asyncio.Future[Message]] | str:
        """The oldest commit once its answer is in and is no Ack, or why it is too late
        (``lateness`` looks once a ``timeout``)."""
        while True:
            self.attention.clear()
            front = self.front()
            if front is not None and front[1].done() and not _acked(front[1]):
                return front
            try:
                async with asyncio.timeout(timeout):
                    await self.attention.wait()
            except TimeoutError:
                front = self.front()
                late = lateness.look(None if front is None else front[1])
                if late is not None:
                    return late

    def front(self) -> tuple[Pending, asyncio.Future[Message]] | None:
        """The oldest commit in flight and its answer, if any."""
        return self._items[0] if self._items else None

    def pop(self) -> tuple[Pending, asyncio.Future[Message]]:
        item = self._items.popleft()
        self._bytes.give(self._sizes.popleft())
        self._room.give(1)
        return item

    def release(self, size: int) -> None:
        """Give back a slot taken for a commit that was not sent after all."""
        self._bytes.give(size)
        self._room.give(1)

    def __bool__(self) -> bool:
        return bool(self._items)


def _acked(answer: asyncio.Future[Message]) -> bool:
    """Whether a done answer confirms its commit (anything but an error)."""
    return not answer.cancelled() and answer.exception() is None


class Lateness:
    """How late the oldest commit's answer is, looked at once a timeout (the confirmer's
    watch, :func:`answered`'s rule): a commit that has been the oldest for a whole timeout
    with nothing heard from the peer, or for :data:`BUSY_ROUNDS` timeouts of a peer that
    kept sending, will get no answer in this session. It is looked at from the first
    look that finds it the oldest, so it is given one to two timeouts."""

    def __init__(self, frames_read: Callable[[], int], timeout: float) -> None:
        self._frames_read = frames_read
        self._timeout = timeout
        self._watched: asyncio.Future[Message] | None = None
        self._rounds = 0
        self._heard = 0

    def look(self, oldest: asyncio.Future[Message] | None) -> str | None:
        """Why ``oldest`` (the oldest answer awaited now) is given up, or ``None``."""
        if oldest is None or oldest.done():
            self._watched = None
            return None
        heard = self._frames_read()
        if oldest is not self._watched:
            self._watched, self._rounds, self._heard = oldest, 0, heard
            return None
        if heard == self._heard:
            return f"no answer in {self._timeout:g} s with nothing heard meanwhile"
        self._rounds, self._heard = self._rounds + 1, heard
        if self._rounds >= BUSY_ROUNDS:
            return f"no answer in {BUSY_ROUNDS} timeouts of {self._timeout:g} s"
        return None


def answers_each(response: Message | None, count: int) -> bool:
    """Whether ``response`` holds a verdict for each of ``count`` commits sent together."""
    return isinstance(response, VerdictsResponse) and len(response.verdicts) == count


def verdicts(answer: asyncio.Future[Message], count: int) -> list[asyncio.Future[Message]]:
    """One answer per commit of a frame that carried ``count`` of them (a
    :class:`~mycelia.proto.peering.CommitsRequest`), settled with ``answer``: an Ack for a
    committed one, the peer's error (:func:`~mycelia.errors.remote`) for a refused one.
    When the frame fails as a whole, each gets its failure: the connection's, a
    :class:`~mycelia.errors.RemoteProtocolError` for an answer that is not a verdict per
    commit, or for an error response a RemoteError of the root code (whatever it names,
    it is no verdict on any one commit, so none is reverted for it: they stay owed)."""
    loop = asyncio.get_running_loop()
    parts: list[asyncio.Future[Message]] = [loop.create_future() for _ in range(count)]
    for part in parts:
        part.add_done_callback(_retrieve)

    def settle(done: asyncio.Future[Message]) -> None:
        if done.cancelled():
            for part in parts:
                part.cancel()
            return
        error = done.exception()
        response = None if error is not None else done.result()
        if isinstance(error, RemoteError):  # refused together, not one by one: "not now"
            error = remote(
                code_of(MyceliaError()),
                f"the peer refused {count} commits sent together as a whole ({error})",
            )
        elif error is None and not answers_each(response, count):
            error = RemoteProtocolError(
                f"the peer answered {count} commits sent together with "
                f"{type(response).__name__}, not a verdict for each"
            )
        for i, part in enumerate(parts):
            if part.done():
                continue
            if error is not None:
                part.set_exception(error)
                continue
            assert isinstance(response, VerdictsResponse)
            verdict = response.verdicts[i]
            if verdict.code:
                part.set_exception(remote(verdict.code, verdict.text))
            else:
                part.set_result(Ack(response.request_id))

    answer.add_done_callback(settle)
    return parts
