"""``GET /healthz`` and ``GET /metrics`` on the websocket port of a real ``mycelia serve``.

Metrics are parsed with ``prometheus_client``'s own parser, never by hand.
"""

from __future__ import annotations

import asyncio
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import websockets
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import InvalidStatus

from mycelia.node.tokens import encode_token
from tests.deploy.conftest import Album, Issuer, client
from tests.deploy.servers import Served, start_serve

CLIENTS = 4
COMMITS = 12


def get(url: str, token: bytes | None = None) -> tuple[int, str]:
    """Status and body of ``GET url`` (errors included)."""
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {encode_token(token)}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample in a scrape: (name, labels) → value."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(
    scrape: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return scrape.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Served]:
    served = start_serve(tmp_path, "--shutdown-grace", "60")
    yield served
    if served.process.poll() is None:
        served.process.send_signal(signal.SIGTERM)
        served.err.wait_for("draining: /healthz answers 503")
    assert served.stop(signal.SIGTERM) == 0, served.log()  # the second signal ends the grace


async def scrape(server: Served) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    status, text = await asyncio.to_thread(get, server.http + "/metrics")
    assert status == 200
    return samples(text)


async def commit_load(url: str, halfway: asyncio.Event, resume: asyncio.Event) -> None:
    """CLIENTS clients committing COMMITS albums each, pausing once half are done."""

    async def one(n: int) -> None:
        async with client(url, None) as (node, _):
            for i in range(COMMITS):
                if i == COMMITS // 2:
                    done.append(n)
                    if len(done) == CLIENTS:
                        halfway.set()
                    await resume.wait()
                async with node.context().transaction() as trx:
                    trx.create(Album, artist=f"client {n}", year=i)

    done: list[int] = []
    await asyncio.gather(*(one(n) for n in range(CLIENTS)))


async def test_metrics_scraped_during_a_load_show_commits_latencies_and_traffic(
    server: Served,
) -> None:
    before = await scrape(server)
    halfway, resume = asyncio.Event(), asyncio.Event()
    load = asyncio.ensure_future(commit_load(server.url, halfway, resume))
    await asyncio.wait_for(halfway.wait(), 60)
    during = await scrape(server)
    resume.set()
    await asyncio.wait_for(load, 60)
    after = await scrape(server)

    half = CLIENTS * (COMMITS // 2)
    assert value(before, "mycelia_commits_total") == 0
    assert value(during, "mycelia_commits_total") == half
    assert value(after, "mycelia_commits_total") == CLIENTS * COMMITS
    assert value(after, "mycelia_events_ingested_total", collection="albums") == CLIENTS * COMMITS
    assert value(during, "mycelia_connections", transport="websocket", peer="ephemeral") == CLIENTS
    assert (
        value(after, "mycelia_request_seconds_count", request="CommitRequest") == CLIENTS * COMMITS
    )
    assert value(after, "mycelia_request_seconds_sum", request="CommitRequest") > 0
    assert value(after, "mycelia_request_seconds_bucket", request="CommitRequest", le="+Inf") == (
        CLIENTS * COMMITS
    )
    for direction in ("in", "out"):
        assert (
            value(after, "mycelia_bytes_total", direction=direction)
            > value(during, "mycelia_bytes_total", direction=direction)
            > 0
        )
    assert value(after, "mycelia_storage_bytes") > 0
    assert value(after, "mycelia_connections_accepted_total", transport="websocket") == CLIENTS


async def test_healthz_answers_200_while_serving_and_503_while_draining(server: Served) -> None:
    assert await asyncio.to_thread(get, server.http + "/healthz") == (200, "serving\n")
    server.process.send_signal(signal.SIGTERM)
    server.err.wait_for("draining: /healthz answers 503")
    assert await asyncio.to_thread(get, server.http + "/healthz") == (503, "draining\n")
    with pytest.raises(InvalidStatus, match="HTTP 503"):
        await websockets.connect(server.url)
    assert server.process.poll() is None  # still in its grace period


def test_health_and_metrics_can_be_turned_off(tmp_path: Path) -> None:
    served = start_serve(tmp_path, "--health", "off", "--metrics", "off")
    try:
        for path in ("/healthz", "/metrics"):
            assert get(served.http + path)[0] == 426  # left to the websocket handshake
    finally:
        assert served.stop() == 0


def test_metrics_can_require_a_token_with_the_metrics_grant(tmp_path: Path, issuer: Issuer) -> None:
    served = start_serve(
        tmp_path, "--auth", "tokens", "--token-public-key-file", str(issuer.public_file),
        "--metrics", "token",
    )  # fmt: skip
    try:
        url = served.http + "/metrics"
        assert get(url)[0] == 401
        assert get(url, issuer.token("read:albums"))[0] == 403
        assert get(url, issuer.token("read:_mycelia_metrics", expires_in=-5))[0] == 403
        status, text = get(url, issuer.token("read:_mycelia_metrics"))
        assert status == 200
        assert ("mycelia_commits_total", frozenset()) in samples(text)
        assert get(served.http + "/healthz")[0] == 200  # health needs no token
    finally:
        assert served.stop() == 0
