"""The wire tap and the metrics it feeds, with no network: in-memory transports and an
injected clock (STYLE.md §15, §18)."""

from __future__ import annotations

import pytest

from mycelia.entity import EntityChange
from mycelia.entity.snapshots import absent
from mycelia.errors import ConnectionClosed, Overloaded, PolicyDenied, RemoteProtocolError
from mycelia.node.http import HttpEndpoints
from mycelia.node.metrics import Metrics
from mycelia.node.tokens import TokenAgent, TokenIssuer, encode_token
from mycelia.node.transport import memory_pair
from mycelia.node.wiretap import MeteredTransport, close_code
from mycelia.proto import AdmittedEvent, EntityId, Event
from mycelia.proto.messages import encode_frame
from mycelia.proto.peering import Ack, CommitRequest, ErrorResponse, GetRequest

SYSTEM = EntityId(b"s" * 32)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def test_the_tap_times_requests_counts_bytes_and_reports_refusals() -> None:
    metrics, clock, refusals = Metrics(), Clock(), []
    served, peer = memory_pair()
    tap = MeteredTransport(
        served, metrics, on_refusal=lambda *r: refusals.append(r), why=lambda: None, clock=clock
    )
    get, commit = encode_frame(GetRequest(7, ())), encode_frame(CommitRequest(8, ()))
    await peer.send(get)
    await peer.send(commit)
    assert await tap.recv() == get
    assert await tap.recv() == commit
    clock.now += 0.25
    await tap.send(encode_frame(Ack(7)))
    await tap.send(encode_frame(ErrorResponse(8, 106, "no grant to write 'albums'")))
    assert sample(metrics, "mycelia_request_seconds_sum", request="GetRequest") == 0.25
    assert sample(metrics, "mycelia_request_seconds_count", request="CommitRequest") == 1
    assert sample(metrics, "mycelia_refused_total", reason="PolicyDenied") == 1
    assert refusals == [("CommitRequest", "PolicyDenied", "no grant to write 'albums'")]
    assert sample(metrics, "mycelia_bytes_total", direction="in") == len(get) + len(commit)
    assert sample(metrics, "mycelia_frames_total", direction="out") == 2


async def test_the_tap_passes_frames_it_cannot_read_unchanged() -> None:
    metrics = Metrics()
    served, peer = memory_pair()
    tap = MeteredTransport(served, metrics, on_refusal=lambda *r: None, why=lambda: None)
    for junk in (b"", b"\xc1", b"\x93\x0a", bytes(range(40))):
        await peer.send(junk)
        assert await tap.recv() == junk
        await tap.send(junk)
        assert await peer.recv() == junk
    assert sample(metrics, "mycelia_request_seconds_count", request="GetRequest") is None


@pytest.mark.parametrize(
    ("error", "code", "starts"),
    [
        (None, 1000, ""),
        (PolicyDenied("no token"), 1008, "106 PolicyDenied: no token"),
        (RemoteProtocolError("bad frame"), 1002, "11002 RemoteProtocolError: bad frame"),
        (Overloaded("slow consumer: 9 bytes queued"), 1008, "11006 Overloaded: slow consumer"),
        (ConnectionClosed("the other end closed"), 1000, "the other end closed"),
        (RuntimeError("bug"), 1011, "1 RuntimeError: bug"),
    ],
)
def test_close_codes_say_why_a_connection_ended(
    error: BaseException | None, code: int, starts: str
) -> None:
    assert close_code(error)[0] == code
    assert close_code(error)[1].startswith(starts)


def test_a_close_reason_is_cut_to_123_bytes_without_breaking_a_character() -> None:
    _, reason = close_code(PolicyDenied("é" * 200))
    assert len(reason.encode()) <= 123
    assert reason.endswith("é")


def test_the_connection_gauge_moves_from_handshaking_to_the_peer_kind() -> None:
    metrics = Metrics()
    meter = metrics.connection("asgi")
    assert sample(metrics, "mycelia_connections", transport="asgi", peer="handshaking") == 1
    meter.ready(durable=False)
    assert sample(metrics, "mycelia_connections", transport="asgi", peer="handshaking") == 0
    assert sample(metrics, "mycelia_connections", transport="asgi", peer="ephemeral") == 1
    meter.closed("PolicyDenied")
    meter.closed("PolicyDenied")  # once only
    assert sample(metrics, "mycelia_connections", transport="asgi", peer="ephemeral") == 0
    assert sample(metrics, "mycelia_connections_closed_total", reason="PolicyDenied") == 1


def test_the_hooks_for_node_internals_feed_their_metrics() -> None:
    metrics = Metrics()
    metrics.observe_commit(0.003, origin="remote")
    metrics.observe_storage_write(0.002)
    metrics.outbox_depth(5)
    metrics.live_queries(2)
    assert sample(metrics, "mycelia_commit_seconds_count", origin="remote") == 1
    assert sample(metrics, "mycelia_storage_write_seconds_bucket", le="0.0025") == 1
    assert sample(metrics, "mycelia_outbox_events") == 5
    assert sample(metrics, "mycelia_live_queries") == 2


def test_a_commit_counts_the_entities_and_events_it_changed_by_collection() -> None:
    metrics = Metrics()
    genesis = [
        AdmittedEvent(Event.genesis(collection=c, system=SYSTEM, nonce=bytes([n]) * 16), 1)
        for n, c in enumerate(["albums", "albums", "tracks"])
    ]
    changes = [_change(e.event.collection, (e,)) for e in genesis]
    changes.append(_change("tracks", ()))  # a snapshot's change: an entity, no event
    metrics.changed(changes)
    assert sample(metrics, "mycelia_commits_total") == 1
    assert sample(metrics, "mycelia_entity_changes_total", collection="albums") == 2
    assert sample(metrics, "mycelia_entity_changes_total", collection="tracks") == 2
    assert sample(metrics, "mycelia_events_ingested_total", collection="albums") == 2
    assert sample(metrics, "mycelia_events_ingested_total", collection="tracks") == 1


def _change(collection: str, events: tuple[AdmittedEvent, ...]) -> EntityChange:
    after = absent(EntityId(bytes(32)), collection)
    return EntityChange(after, after, events, frozenset())


def status(endpoints: HttpEndpoints, method: str, path: str, auth: str | None) -> int | None:
    answer = endpoints.answer(method, path, auth)
    return None if answer is None else answer.status


def test_http_endpoints_answer_health_and_guard_metrics() -> None:
    issuer, serving = TokenIssuer(), [True]
    agent = TokenAgent(issuer.public_key)
    endpoints = HttpEndpoints(
        serving=lambda: serving[0], metrics=Metrics(), metrics_auth=agent.allows_metrics
    )
    assert status(endpoints, "GET", "/sync", None) is None
    assert status(endpoints, "GET", "/healthz?probe=1", None) == 200
    serving[0] = False
    assert status(endpoints, "GET", "/healthz", None) == 503
    assert status(endpoints, "POST", "/metrics", None) == 405
    assert status(endpoints, "GET", "/metrics", None) == 401
    assert status(endpoints, "GET", "/metrics", "Bearer !!") == 403
    good = encode_token(issuer.issue("prom", {"_mycelia_metrics": (True, False)}, expires=2**40))
    answer = endpoints.answer("GET", "/metrics", f"Bearer {good}")
    assert answer is not None
    assert answer.status == 200
    assert b"mycelia_commits_total" in answer.body
