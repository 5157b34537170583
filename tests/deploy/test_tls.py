"""``mycelia serve --tls-cert --tls-key`` serves wss:// (a certificate made by the test)."""

from __future__ import annotations

import ssl
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import websockets
from websockets.exceptions import InvalidMessage

from mycelia.node.client import ConnectionState
from tests.deploy.certs import Certs, make_certs
from tests.deploy.conftest import Album, client
from tests.deploy.servers import Served, assert_operator_error, run_cli, start_serve


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_server(certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = start_serve(
        tmp_path_factory.mktemp("tls"), "--tls-cert", str(certs.cert), "--tls-key", str(certs.key)
    )
    yield served
    assert served.stop() == 0, served.log()


def trusting(certs: Certs) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certs.ca))


async def test_a_client_that_trusts_the_certificate_syncs_over_wss(
    tls_server: Served, certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert tls_server.url.startswith("wss://127.0.0.1:")
    # websockets verifies wss:// with the default context, which reads SSL_CERT_FILE.
    monkeypatch.setenv("SSL_CERT_FILE", str(certs.ca))
    async with client(tls_server.url, None) as (node, _), node.context().transaction() as trx:
        album = trx.create(Album, artist="over TLS", year=2024)
    async with client(tls_server.url, None) as (other, _):
        assert (await other.context().get(Album, album.id)).artist == "over TLS"


async def test_a_client_that_does_not_trust_the_certificate_is_refused(
    tls_server: Served,
) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        await websockets.connect(tls_server.url)
    async with client(tls_server.url, None, ready=False) as (_, connection):
        await connection.wait_state(ConnectionState.DISCONNECTED, timeout=20)
        assert isinstance(connection.error, ssl.SSLCertVerificationError), connection.error


async def test_plain_ws_against_a_tls_port_fails_at_the_handshake(
    tls_server: Served, certs: Certs
) -> None:
    with pytest.raises(InvalidMessage, match="did not receive a valid HTTP response"):
        await websockets.connect(tls_server.url.replace("wss://", "ws://"), open_timeout=10)
    async with websockets.connect(tls_server.url, ssl=trusting(certs)) as websocket:
        assert websocket.remote_address is not None  # the TLS port still serves


def test_health_answers_over_https(tls_server: Served, certs: Certs) -> None:
    url = tls_server.http + "/healthz"
    with urllib.request.urlopen(url, context=trusting(certs), timeout=10) as response:
        assert response.status == 200


def test_a_missing_or_mismatched_certificate_is_one_line_and_exit_2(
    certs: Certs, tmp_path: Path
) -> None:
    other = make_certs(tmp_path)
    for cert, key, says in (
        (tmp_path / "nope.pem", certs.key, "does not exist"),
        (certs.cert, other.key, "cannot use TLS certificate"),
    ):
        done = run_cli(
            "serve", "--port", "0", "--data", str(tmp_path / "data"),
            "--tls-cert", str(cert), "--tls-key", str(key),
        )  # fmt: skip
        assert_operator_error(done, says)
        assert not (tmp_path / "data").exists()
