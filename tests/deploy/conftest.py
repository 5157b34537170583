"""Fixtures for the deployment tests: a token issuer on disk and real servers using it.

``auth_server`` is parametrised: the same tests run against ``mycelia serve --auth tokens``
and against uvicorn serving the ASGI endpoint (ARCHITECTURE.md §9: one protocol, two
ways to host it). Servers are started once per module and stopped at its end.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import mycelia
from mycelia import Model, Node, TokenIssuer
from mycelia.node.client import Connection
from mycelia.storage import MemoryStorage
from tests.deploy.servers import Served, start_serve, start_uvicorn


class Album(Model, collection="albums"):
    artist: str
    year: int


class Note(Model, collection="notes"):
    text: str


@dataclass(frozen=True)
class Issuer:
    """An issuer key on disk (secret and public halves) and a way to make tokens."""

    issuer: TokenIssuer
    secret_file: Path
    public_file: Path

    def token(self, *rules: str, expires_in: float = 3600, subject: str = "tester") -> bytes:
        """A token granting ``rules`` (``read:C`` / ``write:C``)."""
        grants: dict[str, tuple[bool, bool]] = {}
        for rule in rules:
            verb, _, collection = rule.partition(":")
            read, write = grants.get(collection, (False, False))
            grants[collection] = (read or verb == "read", write or verb == "write")
        return self.issuer.issue(subject, grants, expires=int(time.time() + expires_in))


@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> Issuer:
    directory = tmp_path_factory.mktemp("issuer")
    issuer = TokenIssuer()
    issuer.write_secret_file(directory / "issuer.pem")
    (directory / "issuer.pub").write_text(issuer.public_key_pem())
    return Issuer(issuer, directory / "issuer.pem", directory / "issuer.pub")


@pytest.fixture(scope="module", params=["mycelia serve", "uvicorn"])
def auth_server(
    request: pytest.FixtureRequest, issuer: Issuer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("server")
    if request.param == "uvicorn":
        served = start_uvicorn(tmp, public_key_file=issuer.public_file)
    else:
        served = start_serve(
            tmp, "--auth", "tokens", "--token-secret-file", str(issuer.secret_file)
        )
    yield served
    clean = (0, -signal.SIGTERM) if request.param == "uvicorn" else (0,)  # uvicorn re-raises it
    assert served.stop() in clean, served.log()


@contextlib.asynccontextmanager
async def client(
    url: str, token: bytes | None, *, ready: bool = True
) -> AsyncIterator[tuple[Node, Connection]]:
    """An ephemeral node connected to ``url`` (ready first, unless ``ready=False``)."""
    node = await Node.open(MemoryStorage(), durable=False)
    try:
        connection = await mycelia.connect(node, url, token=token, max_backoff=0.5)
        if ready:
            await node.wait_ready(timeout=20)
        yield node, connection
    finally:
        await node.close()
