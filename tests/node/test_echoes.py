"""A peer is not sent back its own commits (mycelia.node.serving): the other subscribers
get them, and the committer's next update, from someone else, carries only what it lacks.
Its own create is said to be in the query, with no data (mycelia.node.kept)."""

from __future__ import annotations

from mycelia import Model, Node, Server
from mycelia.proto.messages import Message
from mycelia.proto.peering import (
    Ack,
    CommitRequest,
    DeltasResponse,
    SubscribeRequest,
    SubscriptionUpdate,
)
from mycelia.storage import MemoryStorage
from tests.hostile.serving import RawPeer


class Album(Model, collection="albums"):
    name: str


async def _subscribed(url: str) -> RawPeer:
    peer = await RawPeer.open(url)
    await peer.send(SubscribeRequest(peer.rid(), 1, "albums", "", (), ()))
    assert isinstance(await peer.recv(), DeltasResponse)
    return peer


def _update(msg: Message) -> bool:
    return isinstance(msg, SubscriptionUpdate)


def _carries_events(msg: Message) -> bool:
    return isinstance(msg, SubscriptionUpdate) and any(d.events for d in msg.deltas)


async def test_a_committer_gets_acks_and_the_others_get_the_events(
    server: tuple[Node, Server],
) -> None:
    node, running = server
    author = await Node.open(MemoryStorage(), durable=True)  # makes the events, offline
    await author.join_system(await node.system_events())
    async with author.context().transaction() as trx:
        album = trx.create(Album, name="v0")
    for n in range(1, 6):
        async with author.context().transaction() as trx:
            (await trx.edit(Album, album.id)).name = f"v{n}"
    events = [e.event for e in await author.storage.events_of(album.id)]
    committer, watcher = await _subscribed(running.url), await _subscribed(running.url)
    for event in events:  # one commit each, pipelined
        await committer.send(CommitRequest(committer.rid(), (event,)))
    last = events[-1].id
    while True:  # the watcher is told, as a snapshot or as events (commits may be grouped)
        update = (await watcher.until(_update))[-1]
        assert isinstance(update, SubscriptionUpdate)
        told = {e.id for d in update.deltas for e in d.events}
        told.update(i for d in update.deltas if d.state is not None for i in d.state.state.head)
        if last in told:
            break
    async with node.context().transaction() as trx:  # someone else's edit, after them all
        (await trx.edit(Album, album.id)).name = "from the server"
    *before, update = await committer.until(_carries_events)
    acks = [m for m in before if isinstance(m, Ack)]
    assert len(acks) == len(events)  # no echo came before it, in feed order: but its create
    said = [d for m in before if isinstance(m, SubscriptionUpdate) for d in m.deltas]
    assert [(d.matches, d.state, d.events) for d in said] == [(True, None, ())]  # is kept
    assert isinstance(update, SubscriptionUpdate)
    (delta,) = update.deltas
    assert delta.state is None  # the events it lacks, on the head it holds
    assert len(delta.events) == 1
    await committer.close()
    await watcher.close()
    await author.close()
