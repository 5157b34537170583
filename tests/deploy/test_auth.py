"""Token authentication on real servers: ``mycelia serve --auth tokens`` and uvicorn.

Every test runs against both hosts (the ``auth_server`` fixture), so the ASGI endpoint is
held to exactly what the websockets server does: get, live query, commit, refusal.
"""

from __future__ import annotations

import asyncio

import pytest

from mycelia.errors import EntityNotFound, PolicyDenied
from mycelia.node.client import Connection, ConnectionState
from tests.deploy.conftest import Album, Issuer, Note, client
from tests.deploy.servers import Served


async def refusal(connection: Connection) -> str:
    """What a client that is not let in was told: PolicyDenied from ``wait_ready``, and the
    connection stops retrying (CLOSED)."""
    with pytest.raises(PolicyDenied) as refused:
        await connection.wait_ready(timeout=20)
    assert connection.state is ConnectionState.CLOSED
    assert connection.error is refused.value
    return f"PolicyDenied: {refused.value}"


async def test_a_client_without_a_token_is_refused_at_the_handshake_and_told_why(
    auth_server: Served,
) -> None:
    async with client(auth_server.url, None, ready=False) as (_, connection):
        told = await refusal(connection)
    assert "PolicyDenied: the durable peer refused this node: this server requires a token" in told
    auth_server.err.wait_for(r"refused peer \S+ from \S+: PolicyDenied: this server requires")


async def test_an_expired_or_tampered_token_is_refused(auth_server: Served, issuer: Issuer) -> None:
    expired = issuer.token("read:albums", expires_in=-60)
    async with client(auth_server.url, expired, ready=False) as (_, connection):
        assert "expired" in await refusal(connection)
    tampered = bytearray(issuer.token("read:albums"))
    tampered[len(tampered) // 3] ^= 0x01
    async with client(auth_server.url, bytes(tampered), ready=False) as (_, connection):
        told = await refusal(connection)
    assert "PolicyDenied" in told, told


async def test_a_full_grant_gets_commits_and_follows_a_live_query(
    auth_server: Served, issuer: Issuer
) -> None:
    token = issuer.token("read:albums", "write:albums")
    async with (
        client(auth_server.url, token) as (watcher, _),
        client(auth_server.url, token) as (writer, _),
        watcher.context().query(Album, "year >= ?", 1980) as live,
    ):
        changes = aiter(live)
        await asyncio.wait_for(anext(changes), 20)
        async with writer.context().transaction() as trx:
            album = trx.create(Album, artist="Prince", year=1986)
        seen = await asyncio.wait_for(anext(changes), 20)
        assert [v.id for v in seen.added] == [album.id]
        assert (await watcher.context().get(Album, album.id)).artist == "Prince"


async def test_a_read_grant_reads_but_cannot_write(auth_server: Served, issuer: Issuer) -> None:
    writer = client(auth_server.url, issuer.token("read:albums", "write:albums"))
    async with writer as (w, _), w.context().transaction() as trx:
        album = trx.create(Album, artist="Kate Bush", year=1985)
    async with client(auth_server.url, issuer.token("read:albums")) as (reader, _):
        assert (await reader.context().get(Album, album.id)).year == 1985
        with pytest.raises(PolicyDenied):
            async with reader.context().transaction() as trx:
                (await trx.edit(Album, album.id)).year = 2000
        with pytest.raises(PolicyDenied):
            async with reader.context().transaction() as trx:
                trx.create(Album, artist="nobody", year=1)
    async with client(auth_server.url, issuer.token("read:albums")) as (again, _):
        assert (await again.context().get(Album, album.id)).year == 1985
    auth_server.err.wait_for(r"refused CommitRequest from peer .*PolicyDenied: .*albums")


async def test_a_write_grant_for_one_collection_cannot_write_another(
    auth_server: Served, issuer: Issuer
) -> None:
    token = issuer.token("read:albums", "write:albums", "read:notes")
    async with client(auth_server.url, token) as (node, _):
        async with node.context().transaction() as trx:
            trx.create(Album, artist="allowed", year=1990)
        with pytest.raises(PolicyDenied, match="notes"):
            async with node.context().transaction() as trx:
                trx.create(Note, text="not allowed")
        assert await node.context().fetch(Note, "text = ?", "not allowed") == []


async def test_pushed_updates_never_carry_an_entity_the_token_cannot_read(
    auth_server: Served, issuer: Issuer
) -> None:
    writer_token = issuer.token("read:albums", "write:albums", "read:notes", "write:notes")
    async with client(auth_server.url, writer_token) as (writer, _):
        async with writer.context().transaction() as trx:
            hidden = trx.create(Note, text="before")
        async with (
            client(auth_server.url, issuer.token("read:albums")) as (reader, _),
            reader.context().query(Note, "") as notes,
            reader.context().query(Album, "") as albums,
        ):
            note_changes, album_changes = aiter(notes), aiter(albums)
            assert (await asyncio.wait_for(anext(note_changes), 20)).initial == []
            await asyncio.wait_for(anext(album_changes), 20)
            async with writer.context().transaction() as trx:
                trx.create(Note, text="pushed?")
                (await trx.edit(Note, hidden.id)).text = "edited"
            async with writer.context().transaction() as trx:
                marker = trx.create(Album, artist="marker", year=2001)
            # The server pushes to one peer in commit order: once the later album
            # arrives, any update for the earlier notes would have arrived before it.
            seen = await asyncio.wait_for(anext(album_changes), 20)
            assert marker.id in [v.id for v in seen.added]
            assert notes.changes_nowait() == []
            assert notes.items == []
            assert await reader.storage.scan("notes") == []
            with pytest.raises(EntityNotFound):
                await reader.context().get(Note, hidden.id)
