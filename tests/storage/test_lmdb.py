"""LmdbStorage beyond the shared suite: group commit, map growth, typed open errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import lmdb
import pytest

from mycelia.errors import StorageCorrupt, StorageError, StorageLocked, StorageReadOnly
from mycelia.retrieval import WriteBatch
from mycelia.storage import DumpRecord, EntityRecord
from mycelia.storage.lmdb import LARGE_READ, LmdbStorage
from mycelia.storage.lmdb_format import FORMAT_VERSION
from mycelia.storage.testing import History, genesis, state_of, update


def txn_count(storage: LmdbStorage) -> int:
    return int(storage._env.info()["last_txnid"])


async def test_concurrent_writes_share_transactions_and_syncs(tmp_path: Path) -> None:
    storage = LmdbStorage(tmp_path / "s")
    try:
        before = txn_count(storage)
        histories = [History.make(n=i) for i in range(64)]
        results = await asyncio.gather(
            *(storage.write(WriteBatch((h.g,), (state_of([h.g]),))) for h in histories)
        )
        assert sorted(o for r in results for o in r.offsets) == list(range(1, 65))
        assert txn_count(storage) - before < 64  # grouped: fewer commits than writes
    finally:
        await storage.close()


async def test_feed_rows_read_twice_share_the_id_objects_of_their_heads(tmp_path: Path) -> None:
    storage = LmdbStorage(tmp_path / "s", durable=False)
    try:
        history = History.make()
        await storage.write(WriteBatch((history.g,), (state_of([history.g]),)))
        first, second = await storage.read_since(0), await storage.read_since(0)
        assert first == second
        assert first[0].head.ids[0] is second[0].head.ids[0]
    finally:
        await storage.close()


async def test_a_failing_batch_does_not_take_its_group_down(tmp_path: Path) -> None:
    storage = LmdbStorage(tmp_path / "s", durable=False)
    try:
        histories = [History.make(n=i) for i in range(10)]
        good = [storage.write(WriteBatch((h.g,), (state_of([h.g]),))) for h in histories]
        too_long = "k" * 600  # beyond LMDB's key size: fails inside the write transaction
        bad = storage.write(WriteBatch((genesis(n=99),), (), ((too_long, b"x"),)))
        outcomes = await asyncio.gather(*good[:5], bad, *good[5:], return_exceptions=True)
        assert isinstance(outcomes[5], StorageError)
        assert sorted(
            o for r in outcomes if not isinstance(r, BaseException) for o in r.offsets
        ) == list(range(1, 11))
        assert not await storage.event_stored(genesis(n=99).id)  # the bad batch left nothing
        assert all([await storage.event_stored(h.g.id) for h in histories])
    finally:
        await storage.close()


async def test_the_map_grows_instead_of_filling_up(tmp_path: Path) -> None:
    storage = LmdbStorage(tmp_path / "s", durable=False, map_size=64 * 1024)
    try:
        chain = [genesis()]
        for i in range(LARGE_READ + 500):
            chain.append(update([chain[-1]], b"x" * 200 + b"%d" % i))
        for start in range(0, len(chain), 700):
            await storage.write(WriteBatch(tuple(chain[start : start + 700])))
        assert storage._env.info()["map_size"] > 64 * 1024
        # A long history is read in a worker thread, parents first all the same.
        assert [e.id for e in await storage.events_of(chain[0].entity_id)] == [e.id for e in chain]
    finally:
        await storage.close()


async def test_a_second_opener_gets_storage_locked(tmp_path: Path) -> None:
    first = LmdbStorage(tmp_path / "s")
    try:
        with pytest.raises(StorageLocked):
            LmdbStorage(tmp_path / "s")
        with pytest.raises(StorageLocked):
            LmdbStorage(tmp_path / "s", readonly=True)
    finally:
        await first.close()
    again = LmdbStorage(tmp_path / "s")  # closing released the lock
    await again.close()


async def test_a_read_only_store_reads_and_refuses_writes(tmp_path: Path) -> None:
    h = History.make()
    storage = LmdbStorage(tmp_path / "s")
    await storage.write(WriteBatch(tuple(h.events), (state_of([h.m]),)))
    await storage.close()
    reader = LmdbStorage(tmp_path / "s", readonly=True)
    try:
        assert await reader.get_state(h.entity_id) == state_of([h.m]).state
        assert await reader.last_offset() == 1
        with pytest.raises(StorageReadOnly):
            await reader.write(WriteBatch(meta=(("k", b"v"),)))
    finally:
        await reader.close()
    with pytest.raises(StorageError):
        LmdbStorage(tmp_path / "never-created", readonly=True)


async def test_a_file_that_is_not_a_store_is_reported_corrupt(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "data.mdb").write_bytes(b"not an lmdb file" * 1000)
    with pytest.raises(StorageCorrupt):
        LmdbStorage(tmp_path / "s")


async def test_another_layout_version_is_refused(tmp_path: Path) -> None:
    await LmdbStorage(tmp_path / "s").close()
    env = lmdb.open(str(tmp_path / "s"), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.put(b"format", b"999", db=env.open_db(b"engine", txn=txn))
    env.close()
    with pytest.raises(StorageCorrupt, match="layout version 999, newer than this Mycelia's"):
        LmdbStorage(tmp_path / "s")


def _format_of(path: Path) -> bytes | None:
    env = lmdb.open(str(path), max_dbs=9, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            value = txn.get(b"format", db=env.open_db(b"engine", txn=txn))
            return None if value is None else bytes(value)
    finally:
        env.close()


@pytest.mark.parametrize("older", [b"2", b"3"])
async def test_layouts_2_and_3_are_read_as_they_are_and_bumped_by_a_writable_open(
    tmp_path: Path, older: bytes
) -> None:
    h = History.make()
    storage = LmdbStorage(tmp_path / "s")
    await storage.write(WriteBatch(tuple(h.events), (state_of([h.m]),)))
    await storage.close()
    env = lmdb.open(str(tmp_path / "s"), max_dbs=9)
    with env.begin(write=True) as txn:  # as a store written before text parts (2), or aside (3)
        txn.put(b"format", older, db=env.open_db(b"engine", txn=txn))
        txn.drop(env.open_db(b"parts", txn=txn), delete=True)
    env.close()
    reader = LmdbStorage(tmp_path / "s", readonly=True)
    try:
        assert await reader.get_state(h.entity_id) == state_of([h.m]).state
    finally:
        await reader.close()
    assert _format_of(tmp_path / "s") == older, "a read-only open changed nothing"
    await LmdbStorage(tmp_path / "s").close()
    assert _format_of(tmp_path / "s") == FORMAT_VERSION == b"4"


async def test_a_damaged_event_is_reported_corrupt_not_returned(tmp_path: Path) -> None:
    h = History.make()
    storage = LmdbStorage(tmp_path / "s")
    await storage.write(WriteBatch(tuple(h.events)))
    await storage.close()
    env = lmdb.open(str(tmp_path / "s"), max_dbs=8)
    with env.begin(write=True) as txn:
        db = env.open_db(b"events", txn=txn)
        value = txn.get(h.c.id, db=db)
        assert value is not None
        txn.put(h.c.id, value[:-1] + bytes([value[-1] ^ 1]), db=db)
    env.close()
    storage = LmdbStorage(tmp_path / "s")
    try:
        with pytest.raises(StorageCorrupt):
            await storage.get_events([h.c.id])
        assert h.g.id in await storage.get_events([h.g.id])
    finally:
        await storage.close()


async def test_a_load_larger_than_the_map_grows_it_inside_its_one_transaction(
    tmp_path: Path,
) -> None:
    storage = LmdbStorage(tmp_path / "s", durable=False, map_size=64 * 1024)
    histories = [History.make(n=i) for i in range(400)]

    async def records() -> AsyncIterator[DumpRecord]:
        for h in histories:
            yield EntityRecord(h.entity_id, tuple(h.events), state_of([h.m, h.s], {"n": 1}))

    try:
        before = txn_count(storage)
        assert await storage.load(records()) == 6 * len(histories)
        assert txn_count(storage) - before == 1  # the whole load committed at once
        assert storage._env.info()["map_size"] > 64 * 1024
        assert len(await storage.scan("items")) == len(histories)
        assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [
            "data.mdb",
            "lock.mdb",
            "mycelia.lock",
        ]  # the staging file was unlinked from the start
    finally:
        await storage.close()
