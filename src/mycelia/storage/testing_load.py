"""The conformance checks of :meth:`StorageEngine.load` being all or nothing (§6).

Re-exported by :mod:`mycelia.storage.testing` (in its :data:`CHECKS`). A load stages the
whole stream and commits it at once: a stream that fails part-way, a batch that cannot be
stored, or a feed that moved since ``if_offset`` leaves the engine exactly as it was.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from mycelia.errors import DecodeError, StorageError
from mycelia.retrieval import WriteBatch
from mycelia.storage.engine import DumpRecord, EntityRecord, MetaRecord, StorageEngine
from mycelia.storage.testing_data import History, engine_content, state_of

if TYPE_CHECKING:
    from mycelia.storage.testing import EngineSpec

__all__ = ["check_load_all_or_nothing"]

_HISTORIES = 250
"""Histories in the loaded stream: 1,500 events, more than one staged batch."""


def _records(first: int) -> list[DumpRecord]:
    records: list[DumpRecord] = [MetaRecord("loaded", b"yes")]
    for n in range(first, first + _HISTORIES):
        h = History.make("loaded", n=n)
        records.append(EntityRecord(h.entity_id, tuple(h.events), state_of([h.m, h.s], {"n": n})))
    return records


async def _stream(
    records: Sequence[DumpRecord], *, fail: bool = False
) -> AsyncIterator[DumpRecord]:
    for record in records:
        yield record
    if fail:
        raise DecodeError("the stream was cut after its last record")


async def _refused(engine: StorageEngine, stream: AsyncIterator[DumpRecord], **kw: int) -> str:
    """Load ``stream``, which must fail; returns the error's class name."""
    try:
        await engine.load(stream, **kw)
    except (DecodeError, StorageError) as exc:
        return type(exc).__name__
    raise AssertionError("the load was expected to fail")


async def check_load_all_or_nothing(spec: EngineSpec) -> None:
    """A load that fails anywhere writes nothing; ``if_offset`` refuses a moved feed."""
    engine = await spec.fresh()
    try:
        h = History.make()
        await engine.write(WriteBatch(tuple(h.events), (state_of([h.m, h.s], {"v": 1}),)))
        await engine.write(WriteBatch(meta=(("root", b"r"),)))
        before = await engine_content(engine)
        records = _records(1)
        unstorable = EntityRecord(h.entity_id, (), state_of([h.m], {"v": object()}))
        for name, stream, kw in [
            ("a stream that fails after its last record", _stream(records, fail=True), {}),
            ("a state that cannot be stored", _stream([*records, unstorable]), {}),
            ("a feed that moved", _stream(records), {"if_offset": 0}),
        ]:
            await _refused(engine, stream, **kw)
            after = await engine_content(engine)
            assert after == before, f"{spec.name}: {name} left part of the load behind"
        last = await engine.last_offset()
        assert await engine.load(_stream(records), if_offset=last) == 6 * _HISTORIES
        content = await engine_content(engine)
        loaded = [c for c in content if isinstance(c, tuple) and c[0] == "entity"]
        assert len(loaded) == 1 + _HISTORIES, f"{spec.name}: the load missed entities"
        assert ("meta", "loaded", b"yes") in content, f"{spec.name}: the load missed meta"
    finally:
        await engine.close()
