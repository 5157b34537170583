"""A query's answer reads its rows from storage about a page at a time, as it sends them.

A light query without LIMIT is read in id order a page at a time (keyset paging): its
first page is on the wire before the rest is read. A LIMIT query is ranked first: the
responder keeps about a page of its rows, lets the rest go, and reads them again a batch
at a time before it pages them. So a crowd of fresh subscribers to a large collection
holds about one page each on the server, not the whole result each; and a row changed
while the answer is read is sent only if it still belongs to the result."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Collection

import mycelia
from mycelia import Model, Node
from mycelia.node.served import READ_BYTES
from mycelia.proto import EntityId, EntityState
from mycelia.proto.query import After, Query
from mycelia.retrieval import StoredState
from mycelia.storage import MemoryStorage
from tests.node.waiting import until

KIB = 1024


class Blob(Model, collection="blobs"):
    data: bytes
    keep: bool = True


class Recording(MemoryStorage):
    """MemoryStorage that notes each ``get_states`` read (rows, bytes) and each page
    ``fetch`` reads (after, rows, bytes), and can run a step before the read numbered
    ``before`` (of ``get_states``, or of ``fetch`` pages when ``on_pages``)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[int, int]] = []
        self.pages: list[tuple[EntityId | None, int, int]] = []
        self.step: Callable[[], Awaitable[None]] | None = None
        self.before = 0
        self.on_pages = False
        self.ran = False

    async def _maybe_step(self, done: int) -> None:
        if self.step is not None and done == self.before:
            step, self.step = self.step, None
            await step()
            self.ran = True

    async def get_states(self, ids: Collection[EntityId]) -> dict[EntityId, EntityState]:
        if not self.on_pages:
            await self._maybe_step(len(self.reads))
        found = await super().get_states(ids)
        self.reads.append((len(found), sum(s.wire_size() for s in found.values())))
        return found

    async def fetch(
        self, collection: str, query: Query, *, after: After | None = None
    ) -> list[StoredState]:
        paged = query.limit is not None and collection == Blob.__collection__
        if paged and self.on_pages:
            await self._maybe_step(len(self.pages))
        found = await super().fetch(collection, query, after=after)
        if paged:
            last = None if after is None else EntityId._trusted(after.entity_id)
            self.pages.append((last, len(found), sum(s.state.wire_size() for s in found)))
        return found


async def serve_blobs(count: int, size: int) -> tuple[Node, Recording, list[EntityId]]:
    storage = Recording()
    node = await Node.open(storage, durable=True)
    await node.create_system()
    async with node.context().transaction() as trx:
        ids = [trx.create(Blob, data=os.urandom(size)).id for _ in range(count)]
    return node, storage, ids


@contextlib.asynccontextmanager
async def subscriber_of_blobs(
    count: int, size: int
) -> AsyncIterator[tuple[Recording, list[EntityId], Node]]:
    """A server of ``count`` blobs of ``size`` bytes on real websockets, and a client
    connected to it: (the server's storage, the blobs' ids, the client)."""
    node, storage, ids = await serve_blobs(count, size)
    server = await mycelia.serve(node, host="127.0.0.1", port=0)
    client = await Node.open(MemoryStorage(), durable=False, progress=False)
    try:
        await mycelia.connect(client, server.url)
        await client.wait_ready(timeout=10)
        yield storage, ids, client
    finally:
        await client.close()
        await server.close()
        await node.close()


async def test_a_large_answer_is_read_a_page_at_a_time() -> None:
    """120 entities of 32 KiB (3.8 MB) reach a fresh subscriber whole: the answer reads
    them in id order, one row first, then reads sized to about READ_BYTES and never
    much more, each from the last id of the one before; and the client holds rows of the
    first page before the server reads the second (it waits for them there)."""
    node, storage, ids = await serve_blobs(120, 32 * KIB)
    server = await mycelia.serve(node, host="127.0.0.1", port=0)
    held = MemoryStorage()
    client = await Node.open(held, durable=False, progress=False)

    async def first_page_arrived() -> None:
        async def holds_any() -> bool:
            return any([await held.get_state(entity_id) for entity_id in ids])

        await until(client, holds_any)

    try:
        await mycelia.connect(client, server.url)
        await client.wait_ready(timeout=10)
        storage.reads.clear()
        storage.step, storage.before, storage.on_pages = first_page_arrived, 1, True
        async with client.context().query(Blob, "") as live:
            assert sorted(v.id for v in live.items) == sorted(ids)
            assert all(len(v.data) == 32 * KIB for v in live.items)
        assert storage.ran, "the second page was read after the client held the first"
        assert storage.reads == [], "nothing was ranked and read again"
        ordered = sorted(ids)
        afters = [after for after, _, _ in storage.pages]
        counts = [n for _, n, _ in storage.pages]
        assert sum(counts) == 120
        assert counts[0] == 1  # one row, then reads of about READ_BYTES
        assert len(counts) >= 4
        assert afters == [None, *(ordered[sum(counts[:i]) - 1] for i in range(1, len(counts)))]
        assert max(size for _, _, size in storage.pages[1:]) <= 2 * READ_BYTES
    finally:
        await client.close()
        await server.close()
        await node.close()


async def test_rows_larger_than_a_page_are_read_one_at_a_time() -> None:
    """An answer holds about a page of its result however large its rows: 6 rows of 600 KiB
    are read one by one. (A first read of 16 rows held up to 16 entities of up to 4 MiB
    for each fresh subscriber: 8 subscribers of 12 such rows took a server to 1.4 GB.)"""
    async with subscriber_of_blobs(6, 600 * KIB) as (storage, ids, client):
        async with client.context().query(Blob, "") as live:
            assert sorted(v.id for v in live.items) == sorted(ids)
        counts = [n for _, n, _ in storage.pages]
        assert sum(counts) == 6
        assert max(counts) == 1


async def test_a_large_ranked_answer_is_read_again_in_batches() -> None:
    """A LIMIT query over the same 120 entities of 32 KiB is ranked first: the answer
    keeps about READ_BYTES of the rows it ranked, and reads the rest again from storage in
    batches of one row first, then sized to about READ_BYTES and never much more."""
    async with subscriber_of_blobs(120, 32 * KIB) as (storage, ids, client):
        storage.reads.clear()
        async with client.context().query(Blob, "LIMIT 1000") as live:
            assert sorted(v.id for v in live.items) == sorted(ids)
            assert all(len(v.data) == 32 * KIB for v in live.items)
        rows = [n for n, _ in storage.reads]
        kept = 120 - sum(rows)
        assert 0 < kept <= READ_BYTES // (32 * KIB)
        assert rows[0] == 1
        assert len(rows) >= 4
        assert max(size for _, size in storage.reads[1:]) <= 2 * READ_BYTES


async def test_a_change_between_pages_reaches_the_subscriber() -> None:
    """Between the answer's first and second page, the server edits a row of a later page,
    moves one out of the query, deletes one, edits a row the first page already sent and
    creates a new one: the query then holds exactly the matches, with every new value,
    and the rows that left it never reach the client."""
    node, storage, ids = await serve_blobs(60, 16 * KIB)
    server = await mycelia.serve(node, host="127.0.0.1", port=0)
    held = MemoryStorage()
    client = await Node.open(held, durable=False, progress=False)
    ordered = sorted(ids)  # the first page holds the first 16 of them
    sent, edited, moved, deleted = ordered[3], ordered[20], ordered[30], ordered[59]
    created: list[EntityId] = []

    async def change() -> None:
        async with node.context().transaction() as trx:
            (await trx.edit(Blob, sent)).data = b"again"
            (await trx.edit(Blob, edited)).data = b"new"
            (await trx.edit(Blob, moved)).keep = False
            await trx.delete(Blob, deleted)
            created.append(trx.create(Blob, data=b"born").id)

    try:
        await mycelia.connect(client, server.url)
        await client.wait_ready(timeout=10)
        storage.step, storage.before, storage.on_pages = change, 1, True
        async with client.context().query(Blob, "keep = true") as live:
            assert storage.ran, "the change ran between the first and the second page"

            async def exact() -> bool:
                shown = {v.id: v.data for v in live.items}
                wanted = set(ids) - {moved, deleted} | set(created)
                return set(shown) == wanted and (shown[sent], shown[edited]) == (b"again", b"new")

            await until(client, exact)
        assert await held.get_state(moved) is None
        assert await held.get_state(deleted) is None
    finally:
        await client.close()
        await server.close()
        await node.close()


async def test_a_row_changed_after_the_ranking_is_sent_only_if_it_still_belongs() -> None:
    """A LIMIT query is ranked first. Between the ranking and the first read, the server
    edits one later row (still a match), moves one out of the query and deletes one: the
    answer sends the edited row's new value and neither of the others (the client never
    holds them), and the query then holds exactly the matches."""
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
        async with client.context().query(Blob, "keep = true LIMIT 100") as live:
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
