"""Dump and load (mycelia.storage.dump): any engine to any engine, verified on load."""

from __future__ import annotations

import io
from pathlib import Path

import msgpack
import pytest

from mycelia import Model, Node, Text
from mycelia.errors import DecodeError, IdMismatch, InvalidEvent
from mycelia.storage import StorageEngine
from mycelia.storage.dump import DumpProgress, dump_to, load_from
from mycelia.storage.testing import EngineSpec, engine_content
from tests.storage.conftest import ENGINES, PostgresSchemas, lmdb_spec, memory_spec
from tests.storage.crash_child import Counter


class Doc(Model, collection="docs"):
    body: Text
    tag: bytes


def spec_for(kind: str, request: pytest.FixtureRequest, root: Path) -> EngineSpec:
    if kind == "memory":
        return memory_spec()
    if kind == "lmdb":
        return lmdb_spec(root / "lmdb")
    schemas: PostgresSchemas = request.getfixturevalue("pg_schemas")
    return schemas.spec()


async def filled(engine: StorageEngine) -> StorageEngine:
    """A store with a system, entities in two collections, a long history and a text."""
    node = await Node.open(engine, durable=True)
    await node.create_system()
    ctx = node.context()
    async with ctx.transaction() as trx:
        ids = [trx.create(Counter, worker=i, n=i).id for i in range(20)]
    for n in range(1200):  # longer than one dump record (1,000 events)
        async with ctx.transaction() as trx:
            (await trx.edit(Counter, ids[0])).n = n
    async with ctx.transaction() as trx:
        doc = trx.create(Doc, body="hello", tag=b"\0")
    for n in range(5):  # a text history: its state is recomputed on load like any other
        async with ctx.transaction() as trx:
            (await trx.edit(Doc, doc.id)).body.insert(n, str(n))
    return engine


@pytest.mark.parametrize("source", ENGINES)
@pytest.mark.parametrize("target", ENGINES)
async def test_any_engine_dumps_into_any_engine(
    source: str, target: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if "postgres" in (source, target):
        request.applymarker(pytest.mark.postgres)
    origin = await filled(await spec_for(source, request, tmp_path / "a").fresh())
    copy = await spec_for(target, request, tmp_path / "b").fresh()
    seen: list[int] = []
    try:
        with (tmp_path / "dump").open("wb") as out:
            written = await dump_to(origin, out, progress=lambda p: seen.append(p.entities))
        with (tmp_path / "dump").open("rb") as source_file:
            loaded = await load_from(source_file, copy)
        assert (loaded.entities, loaded.events) == (written.entities, written.events)
        assert (written.entities, written.events) == (22, 1 + 20 + 1200 + 6)
        assert seen == sorted(seen)
        assert seen[-1] == 22
        ours, theirs = await engine_content(origin), await engine_content(copy)
        assert theirs[:-2] == ours[:-2]  # same meta, events and states (feeds are per node)
        node = await Node.open(copy, durable=True)
        assert node.system_root is not None
    finally:
        await origin.close()
        await copy.close()


async def dump_bytes() -> bytes:
    origin = await filled(await memory_spec().fresh())
    out = io.BytesIO()
    await dump_to(origin, out)
    return out.getvalue()


def items(blob: bytes) -> list[object]:
    return list(msgpack.Unpacker(io.BytesIO(blob), raw=False))


def pack(values: list[object]) -> bytes:
    return b"".join(msgpack.packb(v, use_bin_type=True) for v in values)


async def test_load_recomputes_ids_and_refuses_a_tampered_event() -> None:
    values = items(await dump_bytes())
    record = next(v for v in values if isinstance(v, list) and v[0] == "events")
    assert isinstance(record, list)
    generation, body = record[2][0]
    record[2][0] = [generation, body[:-1] + bytes([body[-1] ^ 1])]
    with pytest.raises((DecodeError, IdMismatch)):
        await load_from(io.BytesIO(pack(values)), await memory_spec().fresh())


async def test_load_refuses_a_forged_generation() -> None:
    values = items(await dump_bytes())
    record = next(v for v in values if isinstance(v, list) and v[0] == "events" and len(v[2]) > 2)
    assert isinstance(record, list)
    record[2][1][0] += 5
    with pytest.raises(InvalidEvent, match="generation"):
        await load_from(io.BytesIO(pack(values)), await memory_spec().fresh())


async def test_load_refuses_truncated_or_foreign_files() -> None:
    blob = await dump_bytes()
    cut = pack(items(blob)[:-1])
    with pytest.raises(DecodeError, match="truncated"):
        await load_from(io.BytesIO(cut), await memory_spec().fresh())
    with pytest.raises(DecodeError, match="magic"):
        await load_from(io.BytesIO(pack([["other", 1]])), await memory_spec().fresh())
    with pytest.raises(DecodeError, match="empty"):
        await load_from(io.BytesIO(b""), await memory_spec().fresh())
    with pytest.raises(DecodeError):
        await load_from(io.BytesIO(blob[:10] + b"\xc1" * 50), await memory_spec().fresh())


async def test_a_cut_dump_loads_nothing_and_the_whole_dump_then_loads() -> None:
    blob = await dump_bytes()
    values = items(blob)
    target = await memory_spec().fresh()
    with pytest.raises(DecodeError):
        await load_from(io.BytesIO(pack(values[: len(values) // 2])), target)
    assert await engine_content(target) == await engine_content(await memory_spec().fresh())
    counts: list[DumpProgress] = []
    await load_from(io.BytesIO(blob), target, progress=counts.append)
    origin = await memory_spec().fresh()
    await load_from(io.BytesIO(blob), origin)
    assert (await engine_content(target))[:-2] == (await engine_content(origin))[:-2]
