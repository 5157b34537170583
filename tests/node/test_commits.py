"""Local-first commits on an ephemeral node: pipelined, confirmed in order, or reverted.

Clients reach their server through :class:`InProcessServer` (real peering code over
memory transports: every step is deterministic), except where a real websocket matters.
"""

from __future__ import annotations

import asyncio
import gc
import types
from collections.abc import Callable
from typing import Any

import pytest

from mycelia import Model, Node, Text
from mycelia.errors import (
    CODES,
    CommitReverted,
    ConnectionClosed,
    Disjoint,
    EntityNotFound,
    EventNotFound,
    ForeignSystem,
    InvalidArgument,
    InvalidEvent,
    MyceliaError,
    PayloadTooLarge,
    PendingLimit,
    PolicyDenied,
    StorageError,
    error_class,
    remote,
)
from mycelia.node.inprocess import InProcessServer
from mycelia.node.live import LiveQuery
from mycelia.node.refusals import Rejection, refusal_in
from mycelia.proto import EntityId
from mycelia.storage import MemoryStorage
from tests.node.conftest import NodeFactory


class Doc(Model, collection="docs"):
    title: str
    n: int = 0
    body: Text = Text()


async def client_of(server: InProcessServer) -> Node:
    node = await Node.open(MemoryStorage(), durable=False)
    server.connect(node)
    await node.wait_ready(timeout=10)
    return node


async def create(node: Node, **values: Any) -> EntityId:
    async with node.context().transaction() as trx:
        return trx.create(Doc, **values).id


async def test_a_commit_is_visible_locally_before_the_server_confirms_it(
    served: InProcessServer,
) -> None:
    a = await client_of(served)
    doc = await create(a, title="t")
    async with a.context().query(Doc, "") as live:
        await anext(aiter(live))
        trx = a.context().transaction(wait="local")
        async with trx:
            (await trx.edit(Doc, doc)).n = 1
        assert (await a.context().get(Doc, doc)).n == 1  # read here at once
        seen = await asyncio.wait_for(anext(aiter(live)), 10)
        assert [v.n for v in seen.updated] == [1]  # and the live query shows it
        await trx.confirmed()
    assert (await served.node.context().get(Doc, doc)).n == 1
    assert a.owed() == []
    await a.close()


async def test_a_thousand_pipelined_commits_on_one_entity_are_confirmed_in_order(
    served: InProcessServer,
) -> None:
    a = await client_of(served)
    doc = await create(a, title="t")
    transactions = []
    for i in range(1, 1001):
        trx = a.context().transaction(wait="local")
        async with trx:
            (await trx.edit(Doc, doc)).n = i
        transactions.append(trx)
    assert a.stats().owed_commits > 0  # many in flight at once
    await asyncio.wait_for(asyncio.gather(*(t.confirmed() for t in transactions)), 60)
    history = await served.node.storage.events_of(doc)
    assert [e.generation for e in history] == list(range(1, 1002))  # one chain, in order
    assert (await served.node.context().get(Doc, doc)).n == 1000
    assert a.owed() == []
    await a.close()


async def test_a_refused_third_of_five_pipelined_commits_reverts_it_and_those_built_on_it(
    served: InProcessServer,
) -> None:
    a = await client_of(served)
    doc = await create(a, title="t")
    other = await create(a, title="o")
    rejections = a.rejections()
    titles = ["one", "two", "refused", "four", "five"]
    transactions = []
    async with a.context().query(Doc, "") as live:
        await anext(aiter(live))
        for title in titles:
            trx = a.context().transaction(wait="local")
            async with trx:
                (await trx.edit(Doc, doc)).title = title
                if title == "four":
                    (await trx.edit(Doc, other)).n = 4  # built on 'refused' through doc
            transactions.append(trx)
        outcomes = await asyncio.gather(
            *(t.confirmed() for t in transactions), return_exceptions=True
        )
        assert outcomes[:2] == [None, None]
        assert isinstance(outcomes[2], PolicyDenied)
        assert all(isinstance(o, CommitReverted) for o in outcomes[3:])
        assert all(isinstance(o.__cause__, PolicyDenied) for o in outcomes[3:])  # type: ignore[union-attr]
        reported = [await anext(rejections) for _ in range(3)]
        assert [type(r.error) for r in reported] == [PolicyDenied, CommitReverted, CommitReverted]
        assert set(reported[1].entities) == {doc, other}
        # The client converged to the server's truth, and its live query showed the revert.
        view = await a.context().get(Doc, doc)
        assert (view.title, view.head) == ("two", (await served.node.context().get(Doc, doc)).head)
        assert (await a.context().get(Doc, other)).n == 0
        await _until_items(live, lambda items: {v.title for v in items} == {"two", "o"})
    assert a.owed() == []
    await a.close()


async def test_a_refusal_leaves_commits_on_other_entities_confirmed(
    served: InProcessServer,
) -> None:
    a = await client_of(served)
    docs = [await create(a, title=f"d{i}") for i in range(5)]
    transactions = []
    for i, doc in enumerate(docs):
        trx = a.context().transaction(wait="local")
        async with trx:
            (await trx.edit(Doc, doc)).title = "refused" if i == 2 else f"ok{i}"
        transactions.append(trx)
    outcomes = await asyncio.gather(*(t.confirmed() for t in transactions), return_exceptions=True)
    assert [o is None for o in outcomes] == [True, True, False, True, True]
    assert isinstance(outcomes[2], PolicyDenied)
    titles = [(await a.context().get(Doc, d)).title for d in docs]
    assert titles == ["ok0", "ok1", "d2", "ok3", "ok4"]
    assert [(await served.node.context().get(Doc, d)).title for d in docs] == titles
    await a.close()


async def test_the_default_wait_raises_the_refusal_after_reverting(
    served: InProcessServer,
) -> None:
    a = await client_of(served)
    doc = await create(a, title="t")
    with pytest.raises(PolicyDenied):
        async with a.context().transaction() as trx:
            (await trx.edit(Doc, doc)).title = "refused"
    assert (await a.context().get(Doc, doc)).title == "t"
    await a.close()


async def test_a_refused_create_disappears_from_the_client(served: InProcessServer) -> None:
    a = await client_of(served)
    async with a.context().query(Doc, "") as live:
        await anext(aiter(live))
        trx = a.context().transaction(wait="local")
        async with trx:
            doc = trx.create(Doc, title="refused").id
        added = await asyncio.wait_for(anext(aiter(live)), 10)
        assert [v.id for v in added.added] == [doc]  # local first: it shows at once
        with pytest.raises(PolicyDenied):
            await trx.confirmed()
        await _until_items(live, lambda items: items == [])
    with pytest.raises(EntityNotFound):
        await a.context().get(Doc, doc)
    assert await a.storage.get_state(doc) is None
    assert await a.storage.events_of(doc) == []
    await a.close()


async def test_owed_commits_refused_at_reconnect_revert_report_and_converge(
    served: InProcessServer,
) -> None:
    a = await client_of(served)
    doc = await create(a, title="t")
    kept = await create(a, title="k")
    await served.stop()  # the client is offline now
    async with a.context().transaction() as trx:  # owed: returns at once
        (await trx.edit(Doc, doc)).title = "refused"
    async with a.context().transaction() as trx:
        (await trx.edit(Doc, kept)).n = 7
    assert len(a.owed()) == 2
    rejections = a.rejections()
    served.start()
    await a.wait_ready(timeout=10)  # ready only once the owed commits are answered
    rejection: Rejection = await asyncio.wait_for(anext(rejections), 10)
    assert isinstance(rejection.error, PolicyDenied)
    assert rejection.entities == (doc,)
    assert (await a.context().get(Doc, doc)).title == "t"
    assert (await a.context().get(Doc, kept)).n == 7
    assert (await served.node.context().get(Doc, kept)).n == 7
    assert a.owed() == []
    await a.close()


async def test_a_transaction_open_across_a_revert_of_its_entity_fails_cleanly(
    served: InProcessServer,
) -> None:
    a = await client_of(served)
    doc = await create(a, title="t")
    bad = a.context().transaction(wait="local")
    async with bad:
        (await bad.edit(Doc, doc)).title = "refused"
    slow = a.context().transaction()
    handle = await slow.edit(Doc, doc)  # forked on the refused commit
    handle.n = 5
    with pytest.raises(PolicyDenied):
        await bad.confirmed()
    with pytest.raises(CommitReverted):
        await slow.commit()
    assert (await a.context().get(Doc, doc)).n == 0
    assert (await served.node.context().get(Doc, doc)).n == 0
    await a.close()


async def test_trx_edit_reads_through_an_entity_this_client_never_fetched(
    served: InProcessServer,
) -> None:
    doc = await create(served.node, title="on the server")
    a = await client_of(served)
    async with a.context().transaction() as trx:
        (await trx.edit(Doc, doc)).n = 3
    assert (await served.node.context().get(Doc, doc)).n == 3
    await a.close()


async def test_trx_edit_offline_of_an_entity_not_held_says_so(served: InProcessServer) -> None:
    doc = await create(served.node, title="on the server")
    a = await client_of(served)
    await served.stop()
    async with a.context().transaction() as trx:
        with pytest.raises(
            EntityNotFound, match="does not hold it, and no durable peer is connected"
        ):
            await trx.edit(Doc, doc)
    await a.close()


async def _until_items(
    live: LiveQuery[Doc], done: Callable[[list[Doc]], bool], timeout: float = 10
) -> None:
    """Wait until the live query's items satisfy ``done`` (re-checked on each change)."""
    async with asyncio.timeout(timeout):
        while not done(live.items):
            await anext(aiter(live))


async def test_a_commit_forked_before_a_snapshot_moved_the_head_is_not_refused_locally(
    server: tuple[Node, object], client: NodeFactory
) -> None:
    """The EventNotFound race (real websockets): a client forks an entity it holds as a
    snapshot, a newer snapshot replaces that head (whose events it never held) before the
    commit, and the commit — taken by the server — used to raise on the client."""
    server_node = server[0]
    doc = await create(server_node, title="t")
    b, _ = await client()
    await b.context().get(Doc, doc)  # b holds doc as a state snapshot, without events
    trx = b.context().transaction()
    (await trx.edit(Doc, doc)).n = 42  # forked on that head
    for i in range(10):  # the server moves on; a bridge would now be larger than the state
        async with server_node.context().transaction() as t:
            (await t.edit(Doc, doc)).title = f"v{i}"
    await b.context().get(Doc, doc)  # a snapshot over b's head: the fork's head is gone
    await trx.commit()  # must not raise: the server takes it, and so does b
    mine, theirs = await b.context().get(Doc, doc), await server_node.context().get(Doc, doc)
    assert (mine.n, mine.title, mine.head) == (42, "v9", theirs.head)
    assert theirs.n == 42


@pytest.mark.parametrize(
    ("code", "refused"),
    [
        (CODES[PolicyDenied], True),
        (CODES[PayloadTooLarge], True),
        (CODES[InvalidEvent], True),
        (CODES[ForeignSystem], True),
        (CODES[Disjoint], True),
        (CODES[InvalidArgument], True),
        (10299, True),  # a decode error this node does not know: still a decode error
        (CODES[PendingLimit], False),  # the peer is busy
        (CODES[EventNotFound], False),  # a parent the peer lacks (yet)
        (CODES[StorageError], False),
        (CODES[ConnectionClosed], False),  # it was shutting down
        (CODES[MyceliaError], False),  # an internal error there
        (99, False),  # an unknown family
    ],
)
def test_a_peers_error_code_reverts_only_when_it_says_never(code: int, refused: bool) -> None:
    error = remote(code, "from the peer")
    verdict = refusal_in(error)
    assert (verdict is not None) is refused
    if refused:
        assert type(verdict) is error_class(code)
        assert "from the peer" in str(verdict)


async def test_a_confirmed_transaction_its_caller_keeps_holds_little(
    served: InProcessServer,
) -> None:
    # An editor keeps a handle per keystroke to hear of refusals. Each held its events,
    # its fork bases and more, about ten tracked objects the collector walked in every
    # full collection: a third of an editor's heap after 20,000 keystrokes.
    node = await client_of(served)
    doc = await create(node, title="t")
    count = 500
    kept = []
    for i in range(count):
        trx = node.context().transaction(wait="local")
        async with trx:
            (await trx.edit(Doc, doc)).n = i
        kept.append(trx)
    await kept[-1].confirmed()  # confirmed in order: every one before it too
    gc.collect()  # (it stops tracking the emptied dicts)
    # What the handles hold that the node does not (so no other test's garbage counts).
    held = reachable(kept).keys() - reachable(node).keys()
    per_handle = len(held) / count
    # the transaction, its verdict's handle and future, and the commit's sequence number
    assert per_handle < 5, f"a kept, confirmed transaction holds {per_handle:.1f} objects"
    await node.close()


RUNNING = (types.FrameType, types.CoroutineType, types.GeneratorType, types.AsyncGeneratorType)


def reachable(root: object) -> dict[int, object]:
    """Every tracked object reachable from ``root``, by id, but through running code (the
    node reaches this test's own frame through its event loop)."""
    seen = {id(root): root}
    stack = [root]
    while stack:
        for referent in gc.get_referents(stack.pop()):
            if isinstance(referent, RUNNING):
                continue
            if id(referent) not in seen and gc.is_tracked(referent):
                seen[id(referent)] = referent
                stack.append(referent)
    return seen
