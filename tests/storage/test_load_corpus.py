"""A generated corpus of bad dumps, refused by every engine with nothing changed (issue 16).

The target of each engine holds a newer state of the very system the dumps come from (it
loaded the dump, then its node committed more), so a refusal cannot be explained by an
empty or foreign target. Each bad dump differs from a good one by one defect (its trailer
recounted), and the test asserts the typed error that defect must raise.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from mycelia import Node
from mycelia.errors import (
    DecodeError,
    ForeignNode,
    ForeignSystem,
    InvalidEvent,
    InvalidState,
    MyceliaError,
)
from mycelia.proto.codec import pack
from mycelia.storage import MemoryStorage
from mycelia.storage.dump import load_from
from mycelia.storage.testing import engine_content
from tests.storage.conftest import PostgresSchemas, lmdb_spec, memory_spec
from tests.storage.test_load import (
    Items,
    dump_bytes,
    forge_state,
    items,
    play,
    raise_writer,
    set_queryable,
    set_title,
    spliced,
    state_record,
    system,
    with_meta,
    with_stray_update,
    without_event,
    without_events_of,
)
from tests.storage.test_load import packed as repacked

Corpus = dict[str, tuple[bytes, type[MyceliaError], str]]
"""Each bad dump by name: its bytes, the error it must raise and a word of its message."""


async def corpus() -> tuple[bytes, bytes, Corpus]:
    """(an older good dump, the newest good dump, the bad dumps by name)."""
    node, ids = await system(MemoryStorage())
    older = await dump_bytes(node.storage)
    await play(node, ids[0], 5)
    good = await dump_bytes(node.storage)
    foreign, foreign_ids = await system(MemoryStorage(), tracks=2)
    other = await Node.open(MemoryStorage(), durable=True)
    await other.join_system(await node.system_events())

    def fresh() -> Items:
        return items(good)

    intruder = spliced(fresh(), items(await dump_bytes(foreign.storage)), foreign_ids[1])
    stale = fresh()
    state_record(stale, ids[0])[2:] = state_record(items(older), ids[0])[2:]
    bad: Corpus = {
        "forged state value": (forge_state(fresh(), ids[4], set_title), InvalidState, "values"),
        "forged lww writer": (forge_state(fresh(), ids[4], raise_writer), InvalidState, "lww"),
        "forged queryable values": (
            forge_state(fresh(), ids[4], set_queryable),
            InvalidState,
            "queryable",
        ),
        "older state than its events": (repacked(stale), InvalidState, "older, newer or forged"),
        "state without its events": (without_events_of(fresh(), ids[5]), InvalidState, "history"),
        "missing parent": (without_event(fresh(), ids[0], 10), InvalidEvent, "missing parent"),
        "event of another collection": (
            with_stray_update(fresh(), ids[6], "albums"),
            InvalidEvent,
            "collection",
        ),
        "foreign system": (await dump_bytes(foreign.storage), ForeignSystem, "system root"),
        "foreign entity": (intruder, ForeignSystem, "created in system"),
        "another node": (await dump_bytes(other.storage), ForeignNode, "node key"),
        "2-byte node key": (with_meta(fresh(), "node_key", b"ab"), DecodeError, "node_key"),
        "5-byte system root": (with_meta(fresh(), "system_root", b"12345"), DecodeError, "root"),
        "unknown meta record": (with_meta(fresh(), "surprise", b""), DecodeError, "surprise"),
        "garbled outbox": (with_meta(fresh(), "outbox", pack([b"x"])), DecodeError, "outbox"),
    }
    for tenth in range(1, 10):
        bad[f"cut at {tenth * 10} %"] = (good[: len(good) * tenth // 10], DecodeError, "dump")
    return older, good, bad


@pytest.mark.parametrize("kind", ["memory", "lmdb", "postgres"])
async def test_every_dump_of_the_corpus_is_refused_with_nothing_changed(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    older, good, bad = await corpus()
    if kind == "postgres":
        request.applymarker(pytest.mark.postgres)
        schemas: PostgresSchemas = request.getfixturevalue("pg_schemas")
        spec = schemas.spec()
    else:
        spec = memory_spec() if kind == "memory" else lmdb_spec(tmp_path)
    target = await spec.fresh()
    try:
        await load_from(io.BytesIO(good), target)
        node = await Node.open(target, durable=True)  # the same node, restored; then newer
        (track,) = [s.state.entity_id for s in await target.scan("tracks")][:1]
        await play(node, track, 2)
        before = await engine_content(target)
        failures = []
        for name, (blob, error, word) in bad.items():
            try:
                await load_from(io.BytesIO(blob), target)
            except MyceliaError as exc:
                if not isinstance(exc, error) or word not in str(exc):
                    failures.append(f"{name}: {type(exc).__name__} ({exc}), not {error.__name__}")
            else:
                failures.append(f"{name}: loaded")
            if await engine_content(target) != before:
                failures.append(f"{name}: changed the store")
        assert failures == []
        for blob in (older, good):  # the good dumps load, and move nothing back
            await load_from(io.BytesIO(blob), target)
            assert await engine_content(target) == before
    finally:
        await target.close()


async def test_the_corpus_loads_nothing_into_an_empty_store_either() -> None:
    _, _, bad = await corpus()
    for name, (blob, error, word) in bad.items():
        if name in ("foreign system", "another node"):
            continue  # a whole dump of another node is welcome in an empty store
        target = MemoryStorage()
        empty = await engine_content(target)
        with pytest.raises(error, match=word):
            await load_from(io.BytesIO(blob), target)
        assert await engine_content(target) == empty, name
