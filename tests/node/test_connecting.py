"""Connecting, as a user meets it: bad URLs refused at once, timeouts that say why, and
refusals that stop the redialing (issue 17)."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from pathlib import Path

import pytest

import mycelia
from mycelia import ConnectionState, Model, Node
from mycelia.errors import (
    ConnectTimeout,
    ForeignSystem,
    InvalidArgument,
    MyceliaError,
    PolicyDenied,
    PresenceRejected,
    RequestTimeout,
)
from mycelia.node.client import describe_failure
from mycelia.node.inprocess import InProcessServer
from mycelia.node.peer import PeerConnection
from mycelia.node.tokens import TokenAgent, TokenIssuer
from mycelia.storage import MemoryStorage
from tests.deploy.certs import make_certs


class Post(Model, collection="posts"):
    title: str


def free_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def client() -> Node:
    return await Node.open(MemoryStorage(), durable=False)


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("127.0.0.1:9797", "no scheme"),
        ("http://127.0.0.1:9797", "scheme 'http://'"),
        ("ws://", "no scheme"),
    ],
)
async def test_connect_refuses_a_url_that_is_not_a_websocket_url_at_once(
    url: str, named: str
) -> None:
    node = await client()
    with pytest.raises(InvalidArgument, match="use ws://host:port") as refused:
        await mycelia.connect(node, url)
    if url != "ws://":
        assert named in str(refused.value)
    await node.close()  # nothing was started: closing raises nothing


async def test_connect_refuses_a_token_given_as_text_at_once() -> None:
    """The CLI prints tokens as text; passed as it is, the server closed each handshake
    on a DecodeError and wait_ready timed out with the cause inside its message."""
    node = await client()
    text = "eyJ0b2tlbiI6ICJub3QgYnl0ZXMifQ"
    with pytest.raises(InvalidArgument, match=r"decode_token\(text\)"):
        await mycelia.connect(node, "ws://127.0.0.1:9797", token=text)  # type: ignore[arg-type]
    await node.wait_ready(timeout=0.1)  # nothing was attached: no connection to wait for
    await node.close()


async def test_wait_ready_with_nothing_listening_names_the_state_and_the_refusal() -> None:
    node = await client()
    await mycelia.connect(node, f"ws://127.0.0.1:{free_port()}", min_backoff=0.01)
    started = time.monotonic()
    with pytest.raises(ConnectTimeout) as timed_out:
        await node.wait_ready(timeout=1)
    assert time.monotonic() - started < 5
    error = timed_out.value
    assert isinstance(error, TimeoutError)
    assert isinstance(error, MyceliaError)
    message = str(error)
    assert "not ready after 1 s" in message, message
    assert "connection refused: nothing listens there" in message, message
    assert error.state in {"connecting", "disconnected"}
    assert isinstance(error.cause, OSError)
    await node.close()


async def test_wait_ready_names_a_host_name_that_does_not_resolve() -> None:
    node = await client()
    await mycelia.connect(node, "ws://no-such-host.invalid:9797", min_backoff=0.01)
    with pytest.raises(ConnectTimeout, match="DNS: the host name could not be resolved"):
        await node.wait_ready(timeout=2)
    await node.close()


async def test_wait_ready_names_tls_when_the_certificate_is_not_trusted(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(certs.cert, certs.key)
    server_node = await Node.open(MemoryStorage(), durable=True)
    await server_node.create_system()
    async with await mycelia.serve(server_node, host="127.0.0.1", port=0, ssl=tls) as server:
        node = await client()
        await mycelia.connect(node, server.url, min_backoff=0.01)
        with pytest.raises(ConnectTimeout, match="TLS: the server's certificate is not trusted"):
            await node.wait_ready(timeout=3)
        await node.close()
    await server_node.close()


def test_failures_are_put_in_words_for_version_and_handshake() -> None:
    version = PresenceRejected("peer speaks protocol 9, this node 3")
    assert describe_failure(version).startswith("protocol version: ")
    refused = PresenceRejected("the peer's proof does not verify against its node id")
    assert describe_failure(refused).startswith("handshake: the server refused this node")
    slow = RequestTimeout("the peer did not complete the handshake in time")
    assert describe_failure(slow).startswith("handshake: the server did not answer in time")
    assert describe_failure(None) == "no attempt has failed yet"
    reset = describe_failure(ConnectionResetError())
    assert reset.startswith("network: the server reset the connection (wss:// to a server")


async def token_server() -> tuple[Node, InProcessServer, TokenIssuer]:
    issuer = TokenIssuer()
    node = await Node.open(
        MemoryStorage(),
        durable=True,
        policy=TokenAgent(issuer.public_key, require_token=True),
    )
    await node.create_system()
    return node, InProcessServer(node), issuer


async def test_a_refused_token_stops_the_retrying_and_wait_ready_raises_policy_denied() -> None:
    node, server, issuer = await token_server()
    app = await client()
    connection = server.connect(app, min_backoff=0.01, max_backoff=0.01)
    with pytest.raises(PolicyDenied, match="refused this node: this server requires a token"):
        await app.wait_ready(timeout=10)
    assert connection.state is ConnectionState.CLOSED
    assert isinstance(connection.error, PolicyDenied)
    with pytest.raises(PolicyDenied):  # every later wait says the same
        await connection.wait_ready(timeout=1)
    assert server.connections == []  # no redial is running
    # Connecting again (with a token now) replaces the refused connection.
    token = issuer.issue("ann", {"posts": (True, True)}, expires=int(time.time()) + 60)
    again = server.connect(app, token=token)
    await app.wait_ready(timeout=10)
    assert again.state is ConnectionState.READY
    await connection.close()  # the old connection's close leaves the new one alone
    assert again.state is ConnectionState.READY
    async with app.context().transaction() as trx:
        post = trx.create(Post, title="let in")
    assert (await node.context().get(Post, post.id)).title == "let in"
    await app.close()
    await server.close()
    await node.close()


async def test_a_server_of_another_system_stops_the_retrying_with_foreign_system() -> None:
    ours = await Node.open(MemoryStorage(), durable=True)
    await ours.create_system()
    theirs = await Node.open(MemoryStorage(), durable=True)
    await theirs.create_system()
    app = await client()
    await app.join_system(await ours.system_events())
    server = InProcessServer(theirs)
    connection = server.connect(app, min_backoff=0.01)
    with pytest.raises(ForeignSystem, match="belong to different systems"):
        await app.wait_ready(timeout=10)
    assert connection.state is ConnectionState.CLOSED
    await app.close()
    await server.close()
    await theirs.close()
    await ours.close()


async def test_connection_state_and_error_follow_the_server() -> None:
    server_node = await Node.open(MemoryStorage(), durable=True)
    await server_node.create_system()
    server = InProcessServer(server_node)
    app = await client()
    connection = server.connect(app, min_backoff=0.01, max_backoff=0.05)
    await connection.wait_state(ConnectionState.READY, timeout=10)
    await server.stop()
    await connection.wait_state(ConnectionState.DISCONNECTED, timeout=10)
    with pytest.raises(ConnectTimeout, match="in-process server is stopped"):
        await connection.wait_ready(timeout=0.5)
    server.start()
    await connection.wait_ready(timeout=10)
    await app.close()
    assert connection.state is ConnectionState.CLOSED
    await server.close()
    await server_node.close()


async def _serving(answer: bytes) -> asyncio.Server:
    """A TCP server on 127.0.0.1 that writes ``answer`` to each connection and closes it."""

    async def reply(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(answer)
        await writer.drain()
        writer.close()

    return await asyncio.start_server(reply, "127.0.0.1", 0)


@pytest.mark.parametrize(
    ("answer", "named"),
    [
        # A server that closes at once may be a Mycelia server stopping (before: "is not a
        # Mycelia server"), or a TLS one answering plain text with an alert.
        (b"", "closed the connection without answering the websocket handshake"),
        (b"\x15\x03\x01\x00\x02\x02\x46", "so does a TLS server, which needs wss://"),
        (b"SSH-2.0-OpenSSH_9.6\r\n", "is not a Mycelia server"),
    ],
)
async def test_wait_ready_says_what_answered_the_handshake(answer: bytes, named: str) -> None:
    server = await _serving(answer)
    port = server.sockets[0].getsockname()[1]
    node = await client()
    await mycelia.connect(node, f"ws://127.0.0.1:{port}", min_backoff=0.01)
    with pytest.raises(ConnectTimeout, match=named):
        await node.wait_ready(timeout=1)
    await node.close()
    server.close()
    await server.wait_closed()


async def test_a_session_that_ended_is_not_ready_while_it_closes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The ended session was let go while the link still said READY, and stayed so while its
    # connection closed: a read in between answered from here yet said it had asked the
    # durable peer ("not found here or on the durable peer"), and wait_ready returned.
    server_node = await Node.open(MemoryStorage(), durable=True)
    await server_node.create_system()
    server = InProcessServer(server_node)
    app = await client()
    connection = server.connect(app)
    await connection.wait_ready(timeout=10)
    session, closing, release = app._link.session, asyncio.Event(), asyncio.Event()
    close = PeerConnection.close

    async def held(self: PeerConnection) -> None:
        if self is session:
            closing.set()
            await release.wait()
        await close(self)

    monkeypatch.setattr(PeerConnection, "close", held)
    dropped = asyncio.ensure_future(server.drop())
    await asyncio.wait_for(closing.wait(), 10)  # the client's ended session is closing
    assert connection.state is not ConnectionState.READY
    with pytest.raises(ConnectTimeout):
        await connection.wait_ready(timeout=0.2)
    release.set()
    await dropped
    await connection.wait_ready(timeout=10)
    await app.close()
    await server.close()
    await server_node.close()
