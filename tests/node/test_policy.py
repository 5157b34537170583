"""The token agent: signed per-collection grants checked on connect, read and write."""

from __future__ import annotations

import pytest

import mycelia
from mycelia import Model, Node
from mycelia.errors import EntityNotFound, PolicyDenied
from mycelia.node.tokens import TokenAgent, TokenIssuer
from mycelia.storage import MemoryStorage


class Post(Model, collection="posts"):
    title: str


class Secret(Model, collection="secrets"):
    value: str


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


async def setup() -> tuple[Node, mycelia.Server, TokenIssuer, Clock]:
    issuer, clock = TokenIssuer(), Clock()
    node = await Node.open(
        MemoryStorage(), durable=True, policy=TokenAgent(issuer.public_key, now=clock)
    )
    await node.create_system()
    server = await mycelia.serve(node, host="127.0.0.1", port=0)
    return node, server, issuer, clock


async def client_with(server: mycelia.Server, token: bytes | None) -> Node:
    node = await Node.open(MemoryStorage(), durable=False)
    await mycelia.connect(node, f"ws://127.0.0.1:{server.port}", token=token)
    await node.wait_ready(timeout=10)
    return node


async def test_grants_decide_reads_and_writes_per_collection() -> None:
    node, server, issuer, _ = await setup()
    async with node.context().transaction() as trx:
        secret = trx.create(Secret, value="s")
    token = issuer.issue("ann", {"posts": (True, True), "secrets": (False, False)}, expires=2_000)
    ann = await client_with(server, token)
    async with ann.context().transaction() as trx:
        post = trx.create(Post, title="hello")
    assert (await node.context().get(Post, post.id)).title == "hello"
    with pytest.raises(EntityNotFound):
        await ann.context().get(Secret, secret.id)
    with pytest.raises(PolicyDenied):
        async with ann.context().transaction() as trx:
            trx.create(Secret, value="mine")
    assert await ann.context().fetch(Secret, "") == []
    await ann.close()
    await server.close()


async def test_no_token_reads_and_writes_nothing_and_an_expired_one_is_refused() -> None:
    node, server, issuer, clock = await setup()
    async with node.context().transaction() as trx:
        post = trx.create(Post, title="p")
    anonymous = await client_with(server, None)
    with pytest.raises(EntityNotFound):
        await anonymous.context().get(Post, post.id)
    with pytest.raises(PolicyDenied):
        async with anonymous.context().transaction() as trx:
            trx.create(Post, title="x")
    await anonymous.close()
    token = issuer.issue("bob", {"*": (True, True)}, expires=1_500)
    clock.now = 1_600
    late = await Node.open(MemoryStorage(), durable=False)
    connection = await mycelia.connect(late, f"ws://127.0.0.1:{server.port}", token=token)
    with pytest.raises(PolicyDenied, match="token of 'bob' expired"):
        await connection.wait_ready(timeout=10)  # refused at connect: it stops retrying
    assert connection.state is mycelia.ConnectionState.CLOSED
    await late.close()
    await server.close()


def test_a_token_signed_by_another_issuer_grants_nothing() -> None:
    agent = TokenAgent(TokenIssuer().public_key, now=lambda: 0)
    forged = TokenIssuer().issue("eve", {"*": (True, True)}, expires=10)
    assert agent.grant(mycelia.Credentials(forged)) is None
    tampered = bytearray(TokenIssuer().issue("eve", {"*": (True, True)}, expires=10))
    tampered[5] ^= 1
    assert agent.grant(mycelia.Credentials(bytes(tampered))) is None


async def test_an_open_server_warns_once_that_it_checks_no_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client that sends a token to a server started without --auth tokens expects it to
    be checked; nothing says otherwise unless the server does (it used to accept it in
    silence)."""
    node = await Node.open(MemoryStorage(), durable=True)
    await node.create_system()
    server = await mycelia.serve(node, host="127.0.0.1", port=0)
    clients = []
    try:
        with caplog.at_level("WARNING", logger="mycelia.node.policy"):
            clients.append(await client_with(server, None))
            assert not caplog.records  # no token, nothing to say
            clients += [await client_with(server, b"a token") for _ in range(2)]
        warnings = [r.getMessage() for r in caplog.records]
        assert len(warnings) == 1
        assert "checks none" in warnings[0]
        assert "--auth tokens" in warnings[0]
    finally:
        for client in clients:
            await client.close()
        await server.close()
        await node.close()
