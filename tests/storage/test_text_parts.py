"""A durable engine stores a text state as its parts, so a write computes no canonical
buffer (O(document)); every reader still sees the canonical one (ARCHITECTURE.md §5, §6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mycelia import Model, Node, Text
from mycelia.entity import stored_merge
from mycelia.entity.backends import text as text_backend
from mycelia.errors import DecodeError
from mycelia.proto import Deferred, EntityId, EntityState
from mycelia.proto.codec import pack
from mycelia.storage import MemoryStorage
from mycelia.storage.testing import EngineSpec
from tests.storage.conftest import PostgresSchemas, lmdb_spec
from tests.text_calls import count_canonical


class Page(Model, collection="pages"):
    body: Text


async def _edit(node: Node, page: EntityId, times: int, start: int = 0) -> None:
    for i in range(start, start + times):
        async with node.context().transaction() as trx:
            (await trx.edit(Page, page)).body.insert(0, str(i % 10))


def _text_parts(state: EntityState) -> tuple[bytes, ...] | None:
    for name, buffer in state.state.lazy_buffers():
        if name == "text":
            assert isinstance(buffer, Deferred)
            return None if buffer.ready else buffer.parts
    raise AssertionError("the state has no text buffer")


async def test_text_edits_are_written_without_canonicalising_and_read_back_canonical(
    engine_spec: EngineSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = await engine_spec.fresh()
    node = await Node.open(engine, durable=True)
    await node.create_system()
    async with node.context().transaction() as trx:
        page = trx.create(Page, body="start").id
    calls = count_canonical(monkeypatch)
    await _edit(node, page, 30)
    assert calls == [], "a durable write computed the whole document"
    stored = await engine.get_state(page)
    assert stored is not None
    parts = _text_parts(stored)
    assert parts is not None, "the stored text buffer was computed"
    assert len(parts) >= 31, "the base, then one update per commit since"

    # The canonical buffer a reader sees is the one a replica of the same history has.
    twin = await Node.open(MemoryStorage(), durable=True)
    await twin.join_system(await node.system_events())
    await twin.ingest(await node.context().history(Page, page))
    theirs = await twin.storage.get_state(page)
    assert theirs is not None
    assert stored.state == theirs.state
    assert calls, "the comparison read the canonical buffer"
    await node.close()


@pytest.fixture(params=["lmdb", "postgres"])
def reopenable(request: pytest.FixtureRequest, tmp_path: Path) -> EngineSpec:
    """An engine kind that keeps its store across a reopen (not the in-memory one)."""
    if request.param == "lmdb":
        return lmdb_spec(tmp_path)
    schemas: PostgresSchemas = request.getfixturevalue("pg_schemas")
    return schemas.spec()


async def test_a_reopened_store_goes_on_from_the_stored_base_and_log(
    reopenable: EngineSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine_spec = reopenable
    assert engine_spec.reopen is not None
    engine = await engine_spec.fresh()
    node = await Node.open(engine, durable=True)
    await node.create_system()
    async with node.context().transaction() as trx:
        page = trx.create(Page, body="start").id
    await _edit(node, page, 5)
    stored = await engine.get_state(page)
    assert stored is not None
    before = _text_parts(stored)
    assert before is not None
    await node.close()

    again = await engine_spec.reopen(engine)
    node = await Node.open(again, durable=True)
    calls = count_canonical(monkeypatch)
    await _edit(node, page, 5, start=5)
    assert calls == [], "loading the stored parts and editing on computed the document"
    view = await node.context().get(Page, page)
    assert str(view.body) == "98765" + "43210" + "start"
    stored = await again.get_state(page)
    assert stored is not None
    after = _text_parts(stored)
    assert after is not None
    assert after[: len(before)] == before, "the stored base and log were kept, not rebuilt"
    assert len(after) == len(before) + 5
    await node.close()


def test_the_log_is_folded_past_its_part_count_whatever_its_bytes() -> None:
    ids = text_backend.ClientIds()
    backend = text_backend.TextBackend.empty(ids)
    for i in range(text_backend.LOG_PARTS + 1):
        fork = backend.fork(ids)
        fork.insert("body", 0, str(i % 10))
        diff = fork.take_diff()
        assert diff is not None
        backend._integrate(diff)
    state = backend.deferred_state()
    parts = state.parts if isinstance(state, Deferred) else None
    assert parts is None or len(parts) <= text_backend.LOG_PARTS


def test_stored_parts_decode_only_for_text_and_only_when_well_formed() -> None:
    entity = bytes(32)
    state = [entity, "pages", [[], [], [["text", [b"", b"\x00\x00"]]]]]
    decoded = EntityState.from_bytes(pack(state), merge=stored_merge)
    assert decoded.state.buffer("text") == text_backend.canonical_update([b"\x00\x00"])
    with pytest.raises(DecodeError, match="must be bytes"):  # a wire state never has parts
        EntityState.from_bytes(pack(state))
    lww = [entity, "pages", [[], [], [["lww", [b"\x80"]]]]]
    lazy = EntityState.from_bytes(pack(lww), merge=stored_merge).state
    with pytest.raises(DecodeError, match="only text"):
        lazy.buffers  # noqa: B018
    with pytest.raises(DecodeError, match="no parts"):
        EntityState.from_bytes(
            pack([entity, "pages", [[], [], [["text", []]]]]), merge=stored_merge
        )
    with pytest.raises(DecodeError, match="part of the buffer"):
        EntityState.from_bytes(
            pack([entity, "pages", [[], [], [["text", [1]]]]]), merge=stored_merge
        )
    bad = [entity, "pages", [[], [], [["text", [b"", b"\xff\xff\xff"]]]]]
    lazy = EntityState.from_bytes(pack(bad), merge=stored_merge).state
    with pytest.raises(DecodeError, match="malformed text update"):
        lazy.buffers  # noqa: B018
