"""The size check at commit does not canonicalise a text state (O(document) per event),
and still refuses a text grown past the entity limit (ARCHITECTURE.md §5, §7)."""

from __future__ import annotations

import pycrdt
import pytest

from mycelia import Model, Node, Text
from mycelia.entity import Entity
from mycelia.entity.residents import resident_size
from mycelia.errors import PayloadTooLarge
from mycelia.proto import Limits
from mycelia.storage import MemoryStorage
from tests.text_calls import count_canonical


class Page(Model, collection="pages"):
    body: Text


async def _node(limits: Limits | None = None) -> Node:
    node = await Node.open(MemoryStorage(), durable=True, limits=limits or Limits())
    await node.create_system()
    return node


async def test_ingesting_text_edits_one_at_a_time_canonicalises_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writer = await _node()
    async with writer.context().transaction() as trx:
        page = trx.create(Page, body="start").id
    for i in range(30):
        async with writer.context().transaction() as trx:
            (await trx.edit(Page, page)).body.insert(0, str(i % 10))
    history = await writer.context().history(Page, page)
    replica = await Node.open(MemoryStorage(), durable=True)
    await replica.join_system(await writer.system_events())
    calls = count_canonical(monkeypatch)
    for event in history:  # as pushes arrive: one commit per event
        await replica.ingest([event])
    assert calls == [], "each commit's size check computed the whole document"
    ours, theirs = await writer.storage.get_state(page), await replica.storage.get_state(page)
    assert ours is not None
    assert theirs is not None
    assert ours.state == theirs.state, "the state read later is the canonical one"


async def test_a_text_grown_past_the_entity_limit_is_refused_whole() -> None:
    limits = Limits(max_frame_bytes=64 * 1024)
    node = await _node(limits)
    async with node.context().transaction() as trx:
        page = trx.create(Page, body="x" * (limits.max_entity_bytes * 2 // 3)).id
    with pytest.raises(PayloadTooLarge):
        async with node.context().transaction() as trx:
            (await trx.edit(Page, page)).body.insert(0, "y" * (limits.max_entity_bytes // 2))
    body = str((await node.context().get(Page, page)).body)
    assert body == "x" * (limits.max_entity_bytes * 2 // 3), "nothing of it was kept"


async def test_a_residents_size_estimate_reads_no_text(monkeypatch: pytest.MonkeyPatch) -> None:
    node = await _node()
    async with node.context().transaction() as trx:
        page = trx.create(Page, body="x" * 10_000).id
    stored = await node.storage.get_state(page)
    assert stored is not None
    loaded = Entity.from_state(stored)  # as a read loads it: no text read yet
    reads: list[int] = []
    to_str = pycrdt.Text.__str__

    def counted(self: pycrdt.Text) -> str:
        reads.append(1)
        return to_str(self)

    monkeypatch.setattr(pycrdt.Text, "__str__", counted)
    size = resident_size(loaded)
    assert reads == [], "estimating the size read the whole text"
    assert size >= 10_000, "the text's length counts"
