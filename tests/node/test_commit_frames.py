"""Owed commits made while the frames before them are unanswered go together in one
``CommitsRequest``, and each gets its own verdict (mycelia.node.commits, node.flight).

The server's commits are held (its responder waits on an event) so that what queues on
the client meanwhile is known exactly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from mycelia import EntityId, Node
from mycelia.errors import PayloadTooLarge, PolicyDenied
from mycelia.node.flight import FRAMES
from mycelia.node.inprocess import InProcessServer
from mycelia.proto import Limits
from mycelia.proto.messages import Message
from mycelia.proto.peering import CommitRequest, CommitsRequest, ErrorResponse
from mycelia.storage import MemoryStorage
from tests.node.test_commits import Doc, client_of, create


class Held:
    """The server's commit requests, as they reach its responder; the first is held until
    :meth:`release` (so the client's next commits queue behind the frames in flight)."""

    def __init__(self, server: InProcessServer) -> None:
        self.seen: list[int] = []
        """Commits per request, in arrival order (1 for a CommitRequest)."""
        self.entered = asyncio.Event()
        self._release = asyncio.Event()
        self._responder = server.node._responder
        self._commit = self._responder.commit
        self._responder.commit = self._held  # type: ignore[method-assign]

    async def _held(
        self, peer: Any, requests: Sequence[CommitRequest | CommitsRequest]
    ) -> list[Message]:
        self.seen += [len(r.commits) if isinstance(r, CommitsRequest) else 1 for r in requests]
        if not self.entered.is_set():
            self.entered.set()
            await self._release.wait()
        return await self.answer(peer, requests)

    async def answer(
        self, peer: Any, requests: Sequence[CommitRequest | CommitsRequest]
    ) -> list[Message]:
        return await self._commit(peer, requests)

    def release(self) -> None:
        self._release.set()


async def _edit(node: Node, entity: EntityId, **values: Any) -> Any:
    trx = node.context().transaction(wait="local")
    async with trx:
        doc = await trx.edit(Doc, entity)
        for name, value in values.items():
            setattr(doc, name, value)
    return trx


async def _queued_behind_the_frames(node: Node, held: Held, doc: EntityId) -> list[Any]:
    """FRAMES commits, each in a frame of its own (the first held at the server)."""
    first = [await _edit(node, doc, n=1)]
    await asyncio.wait_for(held.entered.wait(), 10)
    return first + [await _edit(node, doc, n=n) for n in range(2, FRAMES + 1)]


async def test_commits_made_while_the_frames_are_unanswered_go_in_one_frame(
    served: InProcessServer,
) -> None:
    a = await client_of(served)
    doc = await create(a, title="t")
    held = Held(served)
    transactions = await _queued_behind_the_frames(a, held, doc)
    for n in range(FRAMES + 1, FRAMES + 9):  # 8 more while FRAMES are unanswered
        transactions.append(await _edit(a, doc, n=n))
    held.release()
    await asyncio.wait_for(asyncio.gather(*(t.confirmed() for t in transactions)), 10)
    assert held.seen == [1] * FRAMES + [8], "one frame per commit, then the 8 queued in one"
    history = await served.node.storage.events_of(doc)
    assert [e.generation for e in history] == list(range(1, FRAMES + 10)), "in commit order"
    assert (await served.node.context().get(Doc, doc)).n == FRAMES + 8
    assert a.owed() == []
    await a.close()


async def test_a_commit_made_while_the_sender_waits_is_sent_by_the_committing_task(
    served: InProcessServer,
) -> None:
    """The sender would send it alone and at once: the committing task sends it itself (a
    task switch less per awaited commit); behind FRAMES unanswered frames, the sender does."""
    a = await client_of(served)
    doc = await create(a, title="t")
    pipeline = a._pipeline
    assert pipeline is not None
    senders: list[asyncio.Task[Any] | None] = []
    dispatch = pipeline._dispatch

    def dispatched(*args: Any) -> None:
        senders.append(asyncio.current_task())
        dispatch(*args)

    pipeline._dispatch = dispatched  # type: ignore[method-assign,assignment]
    held = Held(served)
    transactions = await _queued_behind_the_frames(a, held, doc)
    queued = await _edit(a, doc, n=FRAMES + 1)
    held.release()
    await asyncio.wait_for(asyncio.gather(*(t.confirmed() for t in [*transactions, queued])), 10)
    me = asyncio.current_task()
    assert senders[:FRAMES] == [me] * FRAMES, "sent by the committing task, at once"
    assert len(senders) == FRAMES + 1
    assert senders[FRAMES] is not me, "queued behind the unanswered frames: the sender's"
    assert held.seen == [1] * (FRAMES + 1)
    history = await served.node.storage.events_of(doc)
    assert [e.generation for e in history] == list(range(1, FRAMES + 3)), "in commit order"
    await a.close()


async def test_a_frame_carries_at_most_the_commits_the_limits_allow(
    served: InProcessServer,
) -> None:
    a = await Node.open(MemoryStorage(), durable=False, limits=Limits(max_batch_commits=3))
    served.connect(a)
    await a.wait_ready(timeout=10)
    doc = await create(a, title="t")
    held = Held(served)
    transactions = await _queued_behind_the_frames(a, held, doc)
    for n in range(FRAMES + 1, FRAMES + 8):  # 7 more: frames of 3, 3 and 1
        transactions.append(await _edit(a, doc, n=n))
    held.release()
    await asyncio.wait_for(asyncio.gather(*(t.confirmed() for t in transactions)), 10)
    assert held.seen == [1] * FRAMES + [3, 3, 1]
    assert (await served.node.context().get(Doc, doc)).n == FRAMES + 7
    await a.close()


async def test_each_commit_of_a_frame_gets_its_own_verdict(served: InProcessServer) -> None:
    a = await client_of(served)
    doc, other, third = [await create(a, title=t) for t in ("t", "o", "3")]
    held = Held(served)
    ahead = await _queued_behind_the_frames(a, held, doc)
    together = [
        await _edit(a, doc, title="kept"),
        await _edit(a, other, title="refused"),  # the policy refuses this one alone
        await _edit(a, third, n=3),
    ]
    held.release()
    outcomes = await asyncio.wait_for(
        asyncio.gather(*(t.confirmed() for t in [*ahead, *together]), return_exceptions=True), 10
    )
    assert held.seen == [1] * FRAMES + [3]
    assert outcomes[:FRAMES] == [None] * FRAMES
    assert outcomes[FRAMES] is None
    assert isinstance(outcomes[FRAMES + 1], PolicyDenied)
    assert outcomes[FRAMES + 2] is None
    server = served.node.context()
    assert (await server.get(Doc, doc)).title == "kept"
    assert (await server.get(Doc, other)).title == "o"
    assert (await server.get(Doc, third)).n == 3
    assert (await a.context().get(Doc, other)).title == "o", "the refused one was reverted"
    assert a.owed() == []
    await a.close()


async def test_a_frame_refused_as_a_whole_reverts_nothing_and_batches_stop(
    served: InProcessServer,
) -> None:
    """A peer whose limits are below ours answers the frame with an error: that is no
    verdict on any one commit, so each stays owed and goes again alone."""
    a = await client_of(served)
    doc = await create(a, title="t")
    held = Held(served)
    answer = held.answer

    async def refusing(peer: Any, requests: Sequence[CommitRequest | CommitsRequest]) -> Any:
        if any(isinstance(r, CommitsRequest) for r in requests):
            error = PayloadTooLarge("this server takes fewer events per frame")
            return [ErrorResponse.of(r.request_id, error) for r in requests]
        return await answer(peer, requests)

    held.answer = refusing  # type: ignore[method-assign]
    transactions = await _queued_behind_the_frames(a, held, doc)
    for n in range(FRAMES + 1, FRAMES + 5):
        transactions.append(await _edit(a, doc, n=n))
    held.release()
    outcomes = await asyncio.wait_for(
        asyncio.gather(*(t.confirmed() for t in transactions), return_exceptions=True), 20
    )
    assert outcomes == [None] * (FRAMES + 4), "nothing reverted: pushed again, alone"
    assert held.seen[: FRAMES + 1] == [1] * FRAMES + [4]
    assert set(held.seen[FRAMES + 1 :]) == {1}, "one commit per frame from then on"
    assert (await served.node.context().get(Doc, doc)).n == FRAMES + 4
    assert a.owed() == []
    await a.close()


async def test_draining_waits_for_the_commits_being_applied_and_a_close_finishes_them(
    served: InProcessServer,
) -> None:
    """The server applies a connection's commits in that connection's committer, never
    cancelled: drain() waits for the batch it is applying, and the connection closing
    meanwhile does not cut the batch short (it is durable, though the answer is lost)."""
    a = await client_of(served)
    doc = await create(a, title="t")
    held = Held(served)
    first = await _edit(a, doc, n=1)
    await asyncio.wait_for(held.entered.wait(), 10)
    (peer,) = served.connections
    draining = asyncio.ensure_future(peer.drain(30))
    done, _ = await asyncio.wait({draining}, timeout=0.2)  # (a wait that must run out)
    assert not done, "drain returned while a batch of commits was being applied"
    await peer.close()  # the connection ends while the batch is held
    held.release()
    await asyncio.wait_for(draining, 10)
    await asyncio.wait_for(first.confirmed(), 10)  # pushed again on the next connection
    assert (await served.node.context().get(Doc, doc)).n == 1
    assert held.seen[0] == 1
    await a.close()


async def test_a_commit_the_silent_server_never_answers_goes_again_on_a_new_session(
    served: InProcessServer,
) -> None:
    """The confirmer's watch (mycelia.node.flight.Lateness): the oldest commit unanswered
    for a whole timeout with nothing heard from the server ends the session; the next one
    pushes the commit again, and its answer confirms it."""
    a = await Node.open(MemoryStorage(), durable=False)
    served.connect(a, request_timeout=0.05)  # the pipeline's too
    await a.wait_ready(timeout=10)
    doc = await create(a, title="t")
    held = Held(served)  # the first commit request is held: the server says nothing
    trx = await _edit(a, doc, n=1)
    await asyncio.wait_for(held.entered.wait(), 10)
    await asyncio.wait_for(trx.confirmed(), 10)
    assert held.seen == [1, 1], "pushed again on the next session"
    assert (await served.node.context().get(Doc, doc)).n == 1
    held.release()  # (the first session's server side ends its held batch)
    await a.close()
