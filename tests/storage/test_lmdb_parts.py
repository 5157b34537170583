"""LMDB stores a long text's parts aside and writes only those that changed (layout 4,
``storage/lmdb_format.py``): a keystroke into a long text puts its update, not the text."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import lmdb
import pytest

from mycelia import EntityId, Model, Node, Text
from mycelia.entity.backends.text import COMPACT_MIN
from mycelia.errors import StorageCorrupt
from mycelia.proto import EntityState
from mycelia.proto.codec import pack
from mycelia.proto.query import parse
from mycelia.retrieval import WriteBatch
from mycelia.storage import lmdb_writer
from mycelia.storage.lmdb import LmdbStorage
from mycelia.storage.lmdb_format import ASIDE_BYTES, part_key


class Note(Model, collection="notes"):
    body: Text


LONG = "lorem ipsum " * (ASIDE_BYTES // 6)


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    node = await Node.open(LmdbStorage(tmp_path / "s"), durable=True)
    await node.create_system()
    yield node
    await node.close()


@pytest.fixture
def parts_put(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The ``parts`` keys each write puts, in order (a spy around the writer's txn)."""
    put: list[bytes] = []
    original = lmdb_writer.Writer._put_aside

    class Spy:
        def __init__(self, txn: Any) -> None:
            self._txn = txn

        def put(self, key: bytes, value: bytes, **kw: Any) -> bool:
            put.append(key)
            return bool(self._txn.put(key, value, **kw))

        def __getattr__(self, name: str) -> Any:
            return getattr(self._txn, name)

    def spied(self: lmdb_writer.Writer, txn: Any, state: Any, previous: Any) -> None:
        original(self, cast("Any", Spy(txn)), state, previous)

    monkeypatch.setattr(lmdb_writer.Writer, "_put_aside", spied)
    return put


def _stored_parts(storage: object, entity: EntityId) -> list[bytes]:
    """The ``parts`` keys of ``entity``, read through the open store."""
    assert isinstance(storage, LmdbStorage)
    db = storage._dbs[b"parts"]

    def read(txn: Any) -> list[bytes]:
        cursor = txn.cursor(db=db)
        keys = []
        if cursor.set_range(bytes(entity)):
            for key in cursor.iternext(keys=True, values=False):
                if not key.startswith(bytes(entity)):
                    break
                keys.append(bytes(key))
        return keys

    return storage._read(read)


async def _long_note(node: Node) -> EntityId:
    """A note whose text is long enough to be stored aside."""
    async with node.context().transaction() as trx:
        return trx.create(Note, body=LONG).id


async def _state(storage: LmdbStorage, entity: EntityId) -> EntityState:
    state = await storage.get_state(entity)
    assert state is not None
    return state


async def test_a_keystroke_into_a_long_text_puts_only_its_update(
    node: Node, tmp_path: Path, parts_put: list[bytes]
) -> None:
    ctx = node.context()
    note = await _long_note(node)
    first = len(_stored_parts(node.storage, note))  # (an empty base, the creation's update)
    assert first == 2
    for i in range(5):
        parts_put.clear()
        async with ctx.transaction() as trx:
            (await trx.edit(Note, note)).body.insert(i, "x")
        assert parts_put == [part_key(bytes(note), "text", first + i)], "the new update alone"
    storage = node.storage
    assert isinstance(storage, LmdbStorage)
    assert len(_stored_parts(node.storage, note)) == first + 5
    state = await _state(storage, note)
    await node.close()
    again = LmdbStorage(tmp_path / "s", readonly=True)
    try:
        assert await _state(again, note) == state
        assert state.state.buffer("text") is not None
    finally:
        await again.close()
    reopened = await Node.open(LmdbStorage(tmp_path / "s"), durable=True)
    try:  # a new writer compares with what is stored: the next keystroke puts its update
        parts_put.clear()
        async with reopened.context().transaction() as trx:
            (await trx.edit(Note, note)).body.insert(0, "!")
        assert parts_put == [part_key(bytes(note), "text", first + 5)]
        assert str((await reopened.context().get(Note, note)).body) == "!xxxxx" + LONG
    finally:
        await reopened.close()


async def test_a_new_base_drops_the_stale_parts_and_goes_aside_with_the_next_update(
    node: Node, tmp_path: Path, parts_put: list[bytes]
) -> None:
    ctx = node.context()
    note = await _long_note(node)
    for i in range(3):
        async with ctx.transaction() as trx:
            (await trx.edit(Note, note)).body.insert(i, "y")
    assert len(_stored_parts(node.storage, note)) == 5
    parts_put.clear()
    big = "w" * (COMPACT_MIN + 1)
    async with ctx.transaction() as trx:  # a log past COMPACT_MIN is folded: a new base
        (await trx.edit(Note, note)).body.insert(0, big)
    assert parts_put == [], "a canonical buffer (a base, no log) is stored in the state"
    assert _stored_parts(node.storage, note) == [], "the stale parts are gone"
    async with ctx.transaction() as trx:
        (await trx.edit(Note, note)).body.insert(0, "z")
    assert parts_put == [part_key(bytes(note), "text", 0), part_key(bytes(note), "text", 1)]
    assert len(_stored_parts(node.storage, note)) == 2, "the base and one update, aside"
    assert str((await ctx.get(Note, note)).body) == "z" + big + "yyy" + LONG


async def test_a_short_text_stays_in_its_state_and_forgetting_drops_the_parts(
    node: Node, tmp_path: Path
) -> None:
    ctx = node.context()
    async with ctx.transaction() as trx:
        short = trx.create(Note, body="short").id
        long = trx.create(Note, body=LONG).id
    async with ctx.transaction() as trx:
        (await trx.edit(Note, long)).body.insert(0, "!")
    assert _stored_parts(node.storage, short) == []
    assert len(_stored_parts(node.storage, long)) == 3, "no base, the creation, the edit"
    await node.storage.write(WriteBatch(forget=(long,)))
    assert _stored_parts(node.storage, long) == []
    assert await node.storage.get_state(long) is None


async def test_a_missing_part_is_reported_corrupt(node: Node, tmp_path: Path) -> None:
    ctx = node.context()
    note = await _long_note(node)
    async with ctx.transaction() as trx:
        (await trx.edit(Note, note)).body.insert(0, "!")
    await node.close()
    env = lmdb.open(str(tmp_path / "s"), max_dbs=9)
    with env.begin(write=True) as txn:
        txn.delete(part_key(bytes(note), "text", 1), db=env.open_db(b"parts", txn=txn))
    env.close()
    storage = LmdbStorage(tmp_path / "s", readonly=True)
    try:
        with pytest.raises(StorageCorrupt, match="part 1"):
            await storage.get_state(note)
    finally:
        await storage.close()


async def test_a_write_retried_after_the_map_grew_keeps_every_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction aborted by a full map and retried remembers only what it committed."""
    grown: list[int] = []
    grow = lmdb_writer.Writer._grow

    def counted(self: lmdb_writer.Writer) -> None:
        grown.append(1)
        grow(self)

    monkeypatch.setattr(lmdb_writer.Writer, "_grow", counted)
    node = await Node.open(LmdbStorage(tmp_path / "s", map_size=256 * 1024), durable=True)
    await node.create_system()
    ctx = node.context()
    async with ctx.transaction() as trx:
        note = trx.create(Note, body="").id
    pieces = [LONG[: ASIDE_BYTES * (i + 1)] for i in range(12)]
    for piece in pieces:
        async with ctx.transaction() as trx:
            (await trx.edit(Note, note)).body.insert(0, piece)
    assert grown, "the map never filled: the retry was not exercised"
    expected = "".join(reversed(pieces))
    assert str((await ctx.get(Note, note)).body) == expected
    await node.close()
    fresh = await Node.open(LmdbStorage(tmp_path / "s"), durable=True)
    try:
        assert str((await fresh.context().get(Note, note)).body) == expected
    finally:
        await fresh.close()


async def test_parts_the_writer_does_not_remember_are_compared_with_the_stored_ones(
    node: Node, parts_put: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past REMEMBERED_BYTES (a large load, many long texts), the writer reads back what
    is stored: still only the new update is put, and nothing is lost."""
    monkeypatch.setattr(lmdb_writer, "REMEMBERED_BYTES", 1)
    ctx = node.context()
    note = await _long_note(node)
    first = len(_stored_parts(node.storage, note))
    parts_put.clear()
    pending = []
    for i in range(4):  # pipelined: they may share one transaction
        trx = ctx.transaction(wait="local")
        async with trx:
            (await trx.edit(Note, note)).body.insert(i, "q")
        pending.append(trx)
    for trx in pending:
        await trx.confirmed()
    assert parts_put == [part_key(bytes(note), "text", first + i) for i in range(4)]
    assert str((await ctx.get(Note, note)).body) == "qqqq" + LONG


class Tag(Model, collection="tags"):
    name: str


async def test_a_stored_state_keeps_its_bytes_to_be_served_unless_its_parts_are_merged(
    node: Node,
) -> None:
    """An answer's pages splice a stored state's bytes in as they are (``EntityState.wire``,
    ``proto/delta.encode_deltas``): they must be exactly what encoding the state gives."""
    ctx = node.context()
    async with ctx.transaction() as trx:
        tag = trx.create(Tag, name="jazz").id
        short = trx.create(Note, body="short").id
        long = trx.create(Note, body=LONG).id
    async with ctx.transaction() as trx:  # a logged update: its buffer is parts, in place
        (await trx.edit(Note, short)).body.insert(0, "a ")
    storage = node.storage
    assert isinstance(storage, LmdbStorage)
    rows = await storage.fetch("tags", parse("name = 'jazz'"))
    states = [row.state for row in rows] + [await _state(storage, e) for e in (tag, short, long)]
    for state in states:
        if state.entity_id == tag:
            assert state.wire is not None
        if state.wire is not None:
            assert state.wire == pack(state.to_wire())
    assert (await _state(storage, long)).wire is None, "parts read back aside: merged"
