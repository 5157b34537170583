"""A query's answer reads its rows from storage about a page at a time, as it sends them:
the responder ranks the result, keeps about a page of its rows, lets the rest go, and
reads them again a batch at a time before it pages them. So a crowd of fresh subscribers
to a large collection holds about one page each on the server, not the whole result each;
and a row changed between the ranking and its read is sent only if it still belongs to the
result."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Collection

import mycelia
from mycelia import Model, Node
from mycelia.node.served import READ_BYTES
from mycelia.proto import EntityId, EntityState
from mycelia.storage import MemoryStorage
from tests.node.waiting import until

KIB = 1024


class Blob(Model, collection="blobs"):
    data: bytes
    keep: bool = True


class Recording(MemoryStorage):
    """MemoryStorage that notes each ``get_states`` read (rows, bytes), and can run a step
    before the read numbered ``before``."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[int, int]] = []
        self.step: Callable[[], Awaitable[None]] | None = None
        self.before = 0
        self.ran = False

    async def get_states(self, ids: Collection[EntityId]) -> dict[EntityId, EntityState]:
        if self.step is not None and len(self.reads) == self.before:
            step, self.step = self.step, None
            await step()
            self.ran = True
        found = await super().get_states(ids)
        self.reads.append((len(found), sum(s.wire_size() for s in found.values())))
        return found


async def serve_blobs(count: int, size: int) -> tuple[Node, Recording, list[EntityId]]:
    storage = Recording()
    node = await Node.open(storage, durable=True)
    await node.create_system()
    async with node.context().transaction() as trx:
        ids = [trx.create(Blob, data=os.urandom(size)).id for _ in range(count)]
    return node, storage, ids


async def test_a_large_answer_is_read_a_page_at_a_time() -> None:
    """120 entities of 32 KiB (3.8 MB) reach a fresh subscriber whole: the answer keeps
    about READ_BYTES of the rows it ranked, and reads the rest again from storage in
    batches that grow from 16 rows to about READ_BYTES and never hold much more."""
    node, storage, ids = await serve_blobs(120, 32 * KIB)
    server = await mycelia.serve(node, host="127.0.0.1", port=0)
    client = await Node.open(MemoryStorage(), durable=False, progress=False)
    try:
        await mycelia.connect(client, server.url)
        await client.wait_ready(timeout=10)
        storage.reads.clear()
        async with client.context().query(Blob, "") as live:
            assert sorted(v.id for v in live.items) == sorted(ids)
            assert all(len(v.data) == 32 * KIB for v in live.items)
        rows = [n for n, _ in storage.reads]
        kept = 120 - sum(rows)
        assert 0 < kept <= READ_BYTES // (32 * KIB)
        assert rows[0] == 16
        assert len(rows) >= 4
        assert max(size for _, size in storage.reads) <= 2 * READ_BYTES
    finally:
        await client.close()
        await server.close()
        await node.close()


async def test_a_row_changed_after_the_ranking_is_sent_only_if_it_still_belongs() -> None:
    """Between the ranking and the first read, the server edits one later row (still a
    match), moves one out of the query and deletes one: the answer sends the edited row's
    new value and neither of the others (the client never holds them), and the query then
    holds exactly the matches."""
    node, storage, ids = await serve_blobs(40, 64 * KIB)
    server = await mycelia.serve(node, host="127.0.0.1", port=0)
    held = MemoryStorage()
    client = await Node.open(held, durable=False, progress=False)
    ranked = sorted(ids)  # the answer's order without ORDER BY: by id; it keeps the first 16
    edited, moved, deleted = ranked[20], ranked[30], ranked[39]

    async def change() -> None:
        async with node.context().transaction() as trx:
            (await trx.edit(Blob, edited)).data = b"new"
            (await trx.edit(Blob, moved)).keep = False
            await trx.delete(Blob, deleted)

    try:
        await mycelia.connect(client, server.url)
        await client.wait_ready(timeout=10)
        storage.reads.clear()
        storage.step, storage.before = change, 0
        async with client.context().query(Blob, "keep = true") as live:
            assert storage.ran, "the change ran before the answer read its rows again"
            assert {v.id: v.data for v in live.items}[edited] == b"new"

            async def exact() -> bool:
                shown = {v.id: v.data for v in live.items}
                return set(shown) == set(ids) - {moved, deleted} and shown[edited] == b"new"

            await until(client, exact)
        # Neither ever reached the client: the answer did not send them, and no update had to.
        assert await held.get_state(moved) is None
        assert await held.get_state(deleted) is None
    finally:
        await client.close()
        await server.close()
        await node.close()
