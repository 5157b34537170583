"""A commit's late answer (mycelia.node.commits, point 5 of the module): the pipeline
leaves a session only when the peer went silent, not while a loaded peer keeps sending."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager

import pytest

from mycelia import Node
from mycelia.node import commits
from mycelia.node.commits import CommitPipeline
from mycelia.node.flight import BUSY_ROUNDS, answered
from mycelia.node.ports import M, MakeRequest
from mycelia.proto.messages import Message
from mycelia.proto.peering import Ack
from mycelia.storage import MemoryStorage

TIMEOUT = 0.01


class Peer:
    """A session whose peer sends a frame each time the pipeline looks (``busy``), or none;
    ``on_look(n)`` runs at the n-th look (the timeout rounds the pipeline waited)."""

    def __init__(self, *, busy: bool, on_look: Callable[[int], None] = lambda n: None) -> None:
        self.busy = busy
        self.looks = 0
        self._frames = 0
        self._on_look = on_look

    @property
    def frames_read(self) -> int:
        self.looks += 1
        self._on_look(self.looks)
        if self.busy:
            self._frames += 1
        return self._frames

    async def request(
        self, make: MakeRequest, *, expect: type[M], timeout: float | None = None
    ) -> M:
        raise AssertionError("not used")

    def submit(self, make: MakeRequest) -> asyncio.Future[Message]:
        raise AssertionError("not used")

    def stream(
        self, make: MakeRequest, *, timeout: float | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[Message]]:
        raise AssertionError("not used")

    async def wait_closed(self) -> None:
        await asyncio.Event().wait()

    async def close(self) -> None:
        pass


@pytest.fixture
async def pipeline() -> AsyncIterator[CommitPipeline]:
    node = await Node.open(MemoryStorage(), durable=False)
    pipeline = node._pipeline
    assert pipeline is not None
    pipeline._timeout = TIMEOUT
    try:
        yield pipeline
    finally:
        await node.close()


async def test_a_late_answer_from_a_peer_that_keeps_sending_is_waited_for(
    pipeline: CommitPipeline,
) -> None:
    answer: asyncio.Future[Message] = asyncio.get_running_loop().create_future()

    def answered_at_the_fourth_look(n: int) -> None:
        if n == 4:
            answer.set_result(Ack(1))

    peer = Peer(busy=True, on_look=answered_at_the_fourth_look)
    assert await pipeline._answer(peer, answer) is None, "confirmed, three timeouts late"
    assert peer.looks == 4


async def test_a_late_answer_from_a_silent_peer_ends_the_session(pipeline: CommitPipeline) -> None:
    answer: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
    peer = Peer(busy=False)
    with pytest.raises(commits._SessionOver, match="nothing heard"):
        await pipeline._answer(peer, answer)
    assert peer.looks == 2, "one timeout: the look before waiting, and the one after"
    assert not answer.cancelled(), "a late answer is never cancelled by the wait"


async def test_a_peer_that_keeps_sending_but_never_answers_is_left_after_the_busy_rounds(
    pipeline: CommitPipeline,
) -> None:
    answer: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
    peer = Peer(busy=True)
    with pytest.raises(commits._SessionOver, match=f"no answer in {BUSY_ROUNDS} timeouts"):
        await pipeline._answer(peer, answer)
    assert peer.looks == 1 + BUSY_ROUNDS


async def test_an_answer_already_in_is_taken_without_waiting() -> None:
    """Pipelined commits' answers come in bursts: most are in when their turn comes, and
    taking one went through ``asyncio.wait`` (a timer, callbacks, a loop iteration)."""
    answer: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
    answer.set_result(Ack(1))
    step = answered(answer, lambda: 0, TIMEOUT)
    with pytest.raises(StopIteration) as finished:
        step.send(None)  # done in its first step: nothing awaited
    assert finished.value.value is None
