"""``load_from`` trusts nothing and loads all or nothing (issue 16, defect 9).

Each defect of the issue has its test, and a generated corpus of bad dumps (forged state,
missing parent, foreign system, older state, bad meta, cut at every 10 %) is refused by
every engine with nothing changed in the target store (``engine_content`` before/after).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import msgpack
import pytest

from mycelia import EntityId, Model, Node, Text
from mycelia.entity import encode_value
from mycelia.errors import (
    DecodeError,
    ForeignNode,
    ForeignSystem,
    InvalidArgument,
    InvalidState,
    MyceliaError,
)
from mycelia.proto import Clock, EntityState, Event, State
from mycelia.proto.codec import pack, unpack
from mycelia.retrieval import WriteBatch
from mycelia.storage import MemoryStorage, StorageEngine
from mycelia.storage.dump import dump_to, load_from
from mycelia.storage.engine import decode_values, encode_values
from mycelia.storage.lmdb import LmdbStorage
from mycelia.storage.testing import engine_content

Items = list[list[Any]]
"""A dump's records as msgpack decodes them (to be forged)."""


class Track(Model, collection="tracks"):
    title: str
    plays: int
    notes: Text


# ---------------------------------------------------------------- building dumps


async def system(storage: StorageEngine, tracks: int = 12) -> tuple[Node, list[EntityId]]:
    """A durable node with ``tracks`` tracks, one of which has a long history."""
    node = await Node.open(storage, durable=True)
    await node.create_system()
    async with node.context().transaction() as trx:
        ids = [trx.create(Track, title=f"t{i}", plays=0, notes="n").id for i in range(tracks)]
    await play(node, ids[0], 30)
    return node, ids


async def play(node: Node, track: EntityId, times: int) -> None:
    for _ in range(times):
        async with node.context().transaction() as trx:
            edit = await trx.edit(Track, track)
            edit.plays += 1
            edit.notes.insert(0, "+")


async def dump_bytes(engine: StorageEngine) -> bytes:
    out = io.BytesIO()
    await dump_to(engine, out)
    return out.getvalue()


def items(blob: bytes) -> Items:
    return list(msgpack.Unpacker(io.BytesIO(blob), raw=False))


def packed(values: Items) -> bytes:
    """A dump of ``values`` with its trailer recounted (so only the forgery is wrong)."""
    body = [v for v in values if v[0] != "end"]
    entities = {bytes(v[1]) for v in body if v[0] in ("events", "state")}
    events = sum(len(v[2]) for v in body if v[0] == "events")
    trailer = ["end", len(entities), events]
    return b"".join(msgpack.packb(v, use_bin_type=True) for v in [*body, trailer])


def state_record(values: Items, entity: EntityId) -> list[Any]:
    return next(v for v in values if v[0] == "state" and v[1] == bytes(entity))


def forge_state(
    values: Items,
    entity: EntityId,
    change: Callable[[Items, dict[str, object]], None],
) -> bytes:
    """The dump with ``entity``'s LWW rows and queryable values changed by ``change``."""
    record = state_record(values, entity)
    state = EntityState.from_bytes(record[2])
    version, rows = cast("list[Any]", unpack(state.state.buffer("lww") or b""))
    queryable = decode_values(record[3])
    change(rows, queryable)
    buffers = {**dict(state.state.buffers), "lww": pack([version, rows])}
    forged = State.of(head=state.state.head_generations(), buffers=buffers)
    record[2] = EntityState(state.entity_id, state.collection, forged).to_bytes()
    record[3] = encode_values(queryable)
    return packed(values)


def set_title(rows: Items, queryable: dict[str, object]) -> None:
    for row in rows:
        if row[0] == "title":
            row[1] = encode_value("forged")
    queryable["title"] = "forged"


def raise_writer(rows: Items, queryable: dict[str, object]) -> None:
    for row in rows:
        if row[0] == "title":
            row[2] = 10**6  # the same value, but a writer that wins every future merge


def set_queryable(rows: Items, queryable: dict[str, object]) -> None:
    queryable["plays"] = 10**6


def without_events_of(values: Items, entity: EntityId) -> bytes:
    return packed([v for v in values if not (v[0] == "events" and v[1] == bytes(entity))])


def without_event(values: Items, entity: EntityId, index: int) -> bytes:
    record = next(v for v in values if v[0] == "events" and v[1] == bytes(entity))
    del record[2][index]
    return packed(values)


def with_stray_update(values: Items, entity: EntityId, collection: str) -> bytes:
    """The dump with a (validly hashed) update of ``entity`` that names ``collection``."""
    record = next(v for v in values if v[0] == "events" and v[1] == bytes(entity))
    genesis = Event.from_bytes(record[2][0][1])
    stray = Event.update(
        entity_id=entity, collection=collection, parent=Clock([genesis.id]), operations={}
    )
    record[2].insert(1, [2, stray.to_bytes()])
    return packed(values)


def with_meta(values: Items, key: str, value: bytes) -> bytes:
    kept = [v for v in values if not (v[0] == "meta" and v[1] == key)]
    return packed([kept[0], ["meta", key, value], *kept[1:]])


def spliced(values: Items, other: Items, entity: EntityId) -> bytes:
    """``values`` with ``other``'s records of ``entity`` put in their place (id order)."""
    theirs = [v for v in other if v[0] in ("events", "state") and v[1] == bytes(entity)]
    ours = [v for v in values if v[0] != "end"]
    at = next(
        (i for i, v in enumerate(ours) if v[0] != "meta" and bytes(v[1]) > bytes(entity)),
        len(ours),
    )
    return packed([*ours[:at], *theirs, *ours[at:]])


async def refused(blob: bytes, engine: StorageEngine, error: type[MyceliaError]) -> None:
    """Loading ``blob`` raises ``error`` and changes nothing in ``engine``."""
    before = await engine_content(engine)
    with pytest.raises(error):
        await load_from(io.BytesIO(blob), engine)
    assert await engine_content(engine) == before


# ---------------------------------------------------------------- the defects, one by one


async def test_a_forged_state_value_does_not_load() -> None:
    node, ids = await system(MemoryStorage())
    values = items(await dump_bytes(node.storage))
    await refused(forge_state(values, ids[3], set_title), MemoryStorage(), InvalidState)


async def test_a_forged_lww_writer_with_the_true_value_does_not_load() -> None:
    node, ids = await system(MemoryStorage())
    values = items(await dump_bytes(node.storage))
    await refused(forge_state(values, ids[3], raise_writer), MemoryStorage(), InvalidState)


async def test_forged_queryable_values_do_not_load() -> None:
    node, ids = await system(MemoryStorage())
    values = items(await dump_bytes(node.storage))
    await refused(forge_state(values, ids[3], set_queryable), MemoryStorage(), InvalidState)


async def test_a_state_whose_events_are_not_in_the_dump_does_not_load_into_a_durable_store() -> (
    None
):
    node, ids = await system(MemoryStorage())
    values = items(await dump_bytes(node.storage))
    await refused(without_events_of(values, ids[3]), MemoryStorage(), InvalidState)


async def test_a_dump_of_another_system_is_refused_by_a_store_of_one() -> None:
    ours, _ = await system(MemoryStorage())
    theirs, _ = await system(MemoryStorage())
    await refused(await dump_bytes(theirs.storage), ours.storage, ForeignSystem)
    assert await ours.storage.get_meta("system_root") == bytes(ours.system_root or b"")


async def test_a_dump_of_another_node_of_the_same_system_is_refused() -> None:
    ours, _ = await system(MemoryStorage())
    other = await Node.open(MemoryStorage(), durable=True)
    await other.join_system(await ours.system_events())
    await refused(await dump_bytes(other.storage), ours.storage, ForeignNode)


async def test_an_older_dump_never_rolls_a_newer_state_back(tmp_path: Path) -> None:
    node, ids = await system(LmdbStorage(tmp_path / "s"))
    older = await dump_bytes(node.storage)
    await play(node, ids[0], 3)
    before = await engine_content(node.storage)
    newest = await node.context().get(Track, ids[0])
    await load_from(io.BytesIO(older), node.storage)
    assert await engine_content(node.storage) == before
    await node.close()
    again = await Node.open(LmdbStorage(tmp_path / "s"), durable=True)
    view = await again.context().get(Track, ids[0])
    assert (view.plays, view.head) == (newest.plays, newest.head) == (33, newest.head)
    await again.close()


async def test_a_loaded_state_merges_with_the_stored_one() -> None:
    source, ids = await system(MemoryStorage())
    copy = MemoryStorage()
    await load_from(io.BytesIO(await dump_bytes(source.storage)), copy)
    restored = await Node.open(copy, durable=True)  # the same node, restored elsewhere
    async with restored.context().transaction() as trx:
        (await trx.edit(Track, ids[1])).title = "edited in the copy"
    await play(source, ids[1], 2)
    await load_from(io.BytesIO(await dump_bytes(source.storage)), copy)
    restored = await Node.open(copy, durable=True)  # a fresh node: no resident entity
    view = await restored.context().get(Track, ids[1])
    assert (view.title, view.plays, view.notes) == ("edited in the copy", 2, "++n")
    assert len(view.head) == 2  # both tips: the maximal events of both histories


async def test_a_two_byte_node_key_does_not_load() -> None:
    node, _ = await system(MemoryStorage())
    values = items(await dump_bytes(node.storage))
    await refused(with_meta(values, "node_key", b"ab"), MemoryStorage(), DecodeError)


async def test_a_dump_cut_in_half_loads_nothing(tmp_path: Path) -> None:
    node, _ = await system(MemoryStorage(), tracks=3000)
    blob = await dump_bytes(node.storage)
    target = LmdbStorage(tmp_path / "target", durable=False)
    try:
        await refused(blob[: len(blob) // 2], target, DecodeError)
        assert await target.scan("tracks") == []
    finally:
        await target.close()


# ---------------------------------------------------------------- ephemeral dumps


async def test_snapshots_dump_only_as_ephemeral_and_load_only_into_a_cache() -> None:
    node, ids = await system(MemoryStorage())
    assert node.system_root is not None
    (root,) = await node.storage.scan("_mycelia_system")
    (snapshot,) = [s for s in await node.storage.scan("tracks") if s.state.entity_id == ids[2]]
    cache = MemoryStorage()  # what an ephemeral node holds: a snapshot without its events
    root_events = tuple(await node.storage.events_of(node.system_root))
    meta = tuple(await node.storage.scan_meta(""))
    await cache.write(WriteBatch(root_events, (root, snapshot), meta))
    with pytest.raises(InvalidArgument, match="ephemeral"):
        await dump_to(cache, io.BytesIO())
    out = io.BytesIO()
    await dump_to(cache, out, ephemeral=True)
    await refused(out.getvalue(), MemoryStorage(), InvalidState)  # durable: no snapshot
    other_cache = MemoryStorage()
    await load_from(io.BytesIO(out.getvalue()), other_cache, durable=False)
    assert await other_cache.get_state(ids[2]) == snapshot.state
    assert (await engine_content(other_cache))[:-2] == (await engine_content(cache))[:-2]
