"""A commit's late answer (mycelia.node.commits, point 5 of the module): the pipeline
leaves a session only when the peer went silent, not while a loaded peer keeps sending.
And how a commit's handle waits for its answer (mycelia.node.flight)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from mycelia import Node
from mycelia.errors import PolicyDenied
from mycelia.node import commits
from mycelia.node.commits import CommitPipeline
from mycelia.node.flight import BUSY_ROUNDS, Lateness, Pending, SessionOver, answered
from mycelia.node.inprocess import InProcessServer
from mycelia.node.outbox import Owed
from mycelia.node.ports import M, MakeRequest, Streaming
from mycelia.proto.messages import Message
from mycelia.proto.peering import Ack
from mycelia.storage import MemoryStorage
from tests.node.test_commits import Doc, client_of, create

TIMEOUT = 0.01


class Peer:
    """A session whose peer sends a frame each time the pipeline looks (``busy``), or none;
    ``on_look(n)`` runs at the n-th look (the timeout rounds the pipeline waited)."""

    def __init__(self, *, busy: bool, on_look: Callable[[int], None] = lambda n: None) -> None:
        self.request_timeout = TIMEOUT
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

    def stream(self, make: MakeRequest, *, timeout: float | None = None) -> Streaming:
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


async def test_a_handle_waits_for_its_verdict_or_the_session_s_end_with_no_task() -> None:
    """``wait="peer"`` waited with two tasks and a gather per commit (a W4 sequential
    commit spent 98 us from its answer to its caller; 64 now)."""
    over = SessionOver()
    over.begin()
    asked = asyncio.Event()

    def ready() -> bool:
        asked.set()  # (right before it waits)
        return True

    confirmed = Pending(Owed(1, ()), ready=ready, over=over)
    step = confirmed.settled()
    step.send(None)  # up to its first wait
    assert asyncio.all_tasks() == {asyncio.current_task()}, "no task of its own"
    step.close()
    asked.clear()
    waiting = asyncio.ensure_future(confirmed.settled())
    await asyncio.wait_for(asked.wait(), 1)
    confirmed.succeed()
    await asyncio.wait_for(waiting, 1)

    refused = Pending(Owed(2, ()), ready=ready, over=over)
    refused.fail(PolicyDenied("no"))
    with pytest.raises(PolicyDenied):
        await refused.settled()

    unanswered = Pending(Owed(3, ()), ready=ready, over=over)
    asked.clear()
    waiting = asyncio.ensure_future(unanswered.settled())
    await asyncio.wait_for(asked.wait(), 1)
    over.end()  # the session ended: the caller stops waiting; the commit stays owed
    await asyncio.wait_for(waiting, 1)
    assert not unanswered.done()
    assert not over.future.cancelled()


class Frames:
    """A peer's frame counter, moved by hand."""

    def __init__(self) -> None:
        self.read = 0

    def __call__(self) -> int:
        return self.read


async def test_lateness_gives_up_on_a_silent_peer_after_one_whole_timeout_of_watching() -> None:
    frames = Frames()
    lateness = Lateness(frames, TIMEOUT)
    oldest: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
    assert lateness.look(oldest) is None, "first seen as the oldest: watched from now"
    late = lateness.look(oldest)
    assert late is not None
    assert "nothing heard" in late
    assert not oldest.cancelled()


async def test_lateness_waits_for_a_busy_peer_for_the_busy_rounds_and_starts_over_per_commit() -> (
    None
):
    frames = Frames()
    lateness = Lateness(frames, TIMEOUT)
    loop = asyncio.get_running_loop()
    first: asyncio.Future[Message] = loop.create_future()
    assert lateness.look(first) is None
    for _ in range(BUSY_ROUNDS - 1):
        frames.read += 1
        assert lateness.look(first) is None
    second: asyncio.Future[Message] = loop.create_future()
    assert lateness.look(second) is None, "a new oldest commit: watched afresh"
    for _ in range(BUSY_ROUNDS - 1):
        frames.read += 1
        assert lateness.look(second) is None
    frames.read += 1
    assert lateness.look(second) == f"no answer in {BUSY_ROUNDS} timeouts of {TIMEOUT:g} s"
    second.set_result(Ack(1))
    assert lateness.look(second) is None, "answered: nothing is late"
    assert lateness.look(None) is None, "nothing in flight"


async def test_an_ack_confirms_its_commit_where_it_arrives_with_no_confirmer_step(
    served: InProcessServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An Ack is taken by the answer's own callback (mycelia.node.flight.Flight): the
    confirmer task woke twice per commit awaited until confirmed, and ran a timer."""
    a = await client_of(served)
    doc = await create(a, title="t")
    taken = []
    answer = CommitPipeline._answer

    async def counted(self: CommitPipeline, session: Any, future: Any) -> Any:
        taken.append(future)
        return await answer(self, session, future)

    monkeypatch.setattr(CommitPipeline, "_answer", counted)
    for n in range(10):
        async with a.context().transaction() as trx:  # waits until the server confirmed
            (await trx.edit(Doc, doc)).n = n
    assert taken == [], "no Ack went through the confirmer"
    assert a.owed() == []
    assert (await served.node.context().get(Doc, doc)).n == 9
    await a.close()
