"""Policy follows every pushed update (issue 16, defects 2 and 10), in-process with an
injected clock: what a subscriber may no longer read is never pushed, and a subscription
whose token expired ends with a typed error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

import mycelia
from mycelia import Model, Node, Server, TokenAgent, TokenIssuer
from mycelia.entity import Snapshot
from mycelia.errors import CODES, PolicyDenied
from mycelia.node import PermissiveAgent
from mycelia.node.policy import Credentials
from mycelia.proto.peering import (
    DeltasPage,
    DeltasResponse,
    SubscribeRequest,
    SubscriptionEnded,
    SubscriptionUpdate,
)
from mycelia.storage import MemoryStorage
from tests.hostile.serving import RawPeer


class Album(Model, collection="albums"):
    name: str
    private: bool = False


class HidesPrivate(PermissiveAgent):
    """Peers may not read a private album (the node's own contexts may)."""

    def can_read(self, credentials: Credentials, snapshot: Snapshot) -> bool:
        return credentials.local or snapshot.values.get("private") is not True


async def _drain(changes: AsyncIterator[object]) -> None:
    async for _ in changes:
        pass


async def pushes_until(peer: RawPeer, done: type, *, timeout: float = 5) -> list[object]:
    seen: list[object] = []
    async with asyncio.timeout(timeout):
        while not seen or not isinstance(seen[-1], done):
            seen.append(await peer.recv())
    return seen


@pytest.fixture
async def hiding() -> AsyncIterator[tuple[Node, Server]]:
    node = await Node.open(MemoryStorage(), durable=True, policy=HidesPrivate())
    await node.create_system()
    server = await mycelia.serve(node, port=0)
    yield node, server
    await server.close()
    await node.close()


async def test_an_entity_that_becomes_unreadable_is_pushed_without_its_data(
    hiding: tuple[Node, Server],
) -> None:
    """Defect 2: a change was pushed with its events whenever the peer held the previous
    head, even when the peer could no longer read the entity."""
    node, server = hiding
    async with node.context().transaction() as trx:
        album = trx.create(Album, name="public")
    peer = await RawPeer.open(server.url)
    await peer.send(SubscribeRequest(peer.rid(), 1, "albums", "", (), ()))
    answer = await peer.recv()
    assert isinstance(answer, DeltasResponse)
    assert [d.entity_id for d in answer.deltas] == [album.id]
    async with node.context().transaction() as trx:
        handle = await trx.edit(Album, album.id)
        handle.private = True
        handle.name = "the secret name"
    (update,) = await pushes_until(peer, SubscriptionUpdate)
    assert isinstance(update, SubscriptionUpdate)
    (delta,) = update.deltas
    assert (delta.entity_id, delta.matches, delta.state, delta.events) == (
        album.id,
        False,
        None,
        (),
    )
    await peer.close()


@pytest.mark.parametrize("query", ["", "LIMIT 100"], ids=["streamed", "ranked"])
async def test_an_answer_sends_no_row_the_peer_may_not_read(
    hiding: tuple[Node, Server], query: str
) -> None:
    """Read a page at a time (no LIMIT) or ranked first, an answer over 60 albums, every
    third private, sends exactly the public ones: the private rows are skipped in every
    page, not only the first."""
    node, server = hiding
    async with node.context().transaction() as trx:
        albums = [(trx.create(Album, name=f"a{i}", private=i % 3 == 0).id, i) for i in range(60)]
    public = {album for album, i in albums if i % 3}
    peer = await RawPeer.open(server.url)
    await peer.send(SubscribeRequest(peer.rid(), 1, "albums", query, (), ()))
    parts = await pushes_until(peer, DeltasResponse)
    await peer.close()
    assert all(isinstance(p, DeltasPage | DeltasResponse) for p in parts)
    sent = [d for p in parts if isinstance(p, DeltasPage | DeltasResponse) for d in p.deltas]
    assert {d.entity_id for d in sent} == public
    assert len(sent) == len(public)
    assert all(d.matches and d.state is not None for d in sent)


async def test_an_expired_token_ends_the_subscription_with_policy_denied() -> None:
    """Defect 2: after the read token expired, the next update was still pushed."""
    now = [1000.0]
    issuer = TokenIssuer()
    policy = TokenAgent(issuer.public_key, now=lambda: now[0], require_token=True)
    node = await Node.open(MemoryStorage(), durable=True, policy=policy)
    await node.create_system()
    server = await mycelia.serve(node, port=0)
    token = issuer.issue("ann", {"albums": (True, False)}, expires=1010)
    peer = await RawPeer.open(server.url, token=token)
    await peer.send(SubscribeRequest(peer.rid(), 7, "albums", "", (), ()))
    assert isinstance(await peer.recv(), DeltasResponse)
    async with node.context().transaction() as trx:
        trx.create(Album, name="seen while the token holds")
    (update,) = await pushes_until(peer, SubscriptionUpdate)
    assert isinstance(update, SubscriptionUpdate)
    now[0] = 1011.0
    async with node.context().transaction() as trx:
        trx.create(Album, name="after it expired")
    (ended,) = await pushes_until(peer, SubscriptionEnded)
    assert isinstance(ended, SubscriptionEnded)
    assert (ended.query_id, ended.code) == (7, CODES[PolicyDenied])
    assert "expired" in ended.text
    async with node.context().transaction() as trx:
        trx.create(Album, name="and nothing more")
    with pytest.raises(TimeoutError):
        await peer.recv(timeout=0.3)
    assert node.stats().subscriptions == 0
    await peer.close()
    await server.close()
    await node.close()


async def test_a_client_stops_mirroring_a_subscription_its_server_ended() -> None:
    now = [1000.0]
    issuer = TokenIssuer()
    policy = TokenAgent(issuer.public_key, now=lambda: now[0])
    server_node = await Node.open(MemoryStorage(), durable=True, policy=policy)
    await server_node.create_system()
    server = await mycelia.serve(server_node, port=0)
    client = await Node.open(MemoryStorage(), durable=False)
    token = issuer.issue("ann", {"albums": (True, True)}, expires=1010)
    await mycelia.connect(client, server.url, token=token)
    await client.wait_ready(timeout=10)
    async with client.context().query(Album, "") as live:
        changes = aiter(live)
        assert (await anext(changes)).initial == []
        assert server_node.stats().subscriptions == 1
        now[0] = 1011.0
        async with server_node.context().transaction() as trx:
            trx.create(Album, name="after it expired")
        with pytest.raises(PolicyDenied):  # the SubscriptionEnded ends the iteration, typed
            await asyncio.wait_for(_drain(changes), 5)
        # The server lets go of a subscription before it sends its SubscriptionEnded, so
        # once the client has that, the server holds none: no need to poll for it.
        assert server_node.stats().subscriptions == 0
        assert live.items == []  # nothing was pushed after the token expired
    await client.close()
    await server.close()
    await server_node.close()
