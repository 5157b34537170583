"""What an operator reads: one readiness line, a line per connection with the peer id,
address and subject, refusals at WARNING with the reason, optionally as JSON lines."""

from __future__ import annotations

import json
from pathlib import Path

from mycelia.node.client import ConnectionState
from tests.deploy.conftest import Album, Issuer, client
from tests.deploy.servers import start_serve


async def test_json_logs_carry_the_connection_s_peer_address_and_subject(
    tmp_path: Path, issuer: Issuer
) -> None:
    served = start_serve(
        tmp_path, "--log-format", "json", "--log-level", "DEBUG", "--auth", "tokens",
        "--token-secret-file", str(issuer.secret_file),
    )  # fmt: skip
    token = issuer.token("read:albums", "write:albums", subject="ann")
    async with client(served.url, token) as (node, _):
        async with node.context().transaction() as trx:
            trx.create(Album, artist="logged", year=1)
        peer = str(node.node_id)
        served.err.wait_for(r'"message": "commit: 1 events on albums/')
    async with client(served.url, None, ready=False) as (_, refused):
        await refused.wait_state(ConnectionState.CLOSED, timeout=20)  # refused for good
    served.err.wait_for(r'"message": "refused peer')
    assert served.stop() == 0
    records = [json.loads(line) for line in served.err.lines]  # every line is one JSON object
    connected = [
        r
        for r in records
        if r["logger"] == "mycelia.node.server"
        and r["message"].startswith(f"peer {peer} connected")
    ]
    assert len(connected) == 1
    assert connected[0]["subject"] == "ann"
    assert connected[0]["peer"] == peer
    assert connected[0]["address"].startswith("127.0.0.1:")
    assert connected[0]["message"].endswith(" as ann")
    refusal = next(r for r in records if r["message"].startswith("refused peer"))
    assert refusal["level"] == "WARNING"
    assert refusal["reason"] == "PolicyDenied"
    assert "requires a token" in refusal["message"]


def test_a_server_says_it_is_ready_in_one_line(tmp_path: Path) -> None:
    first = start_serve(tmp_path)
    assert first.stop() == 0
    again = start_serve(tmp_path)  # the system exists: nothing to create
    # ready is judged on stdout; stderr's reader may not have taken the line yet
    again.err.wait_for(r"serving ws://")
    assert again.stop() == 0
    ready = [line for line in again.err.lines if "serving ws://" in line]
    before_stop = again.err.lines[: again.err.lines.index(ready[0]) + 1]
    assert len(ready) == 1
    assert before_stop == ready, before_stop
    assert "auth open" in ready[0]
    assert f"store {tmp_path / 'data'}" in ready[0]
    assert again.out.lines == [f"listening on {again.url}"]
