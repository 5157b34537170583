"""The size check at commit does not canonicalise a text state (O(document) per event),
and still refuses a text grown past the entity limit (ARCHITECTURE.md §5, §7)."""

from __future__ import annotations

import pytest

from mycelia import Model, Node, Text
from mycelia.entity.backends import text as text_backend
from mycelia.errors import PayloadTooLarge
from mycelia.proto import Limits
from mycelia.storage import MemoryStorage


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
    calls: list[int] = []
    canonical = text_backend._canonical

    def counted(doc: object) -> bytes:
        calls.append(1)
        return canonical(doc)  # type: ignore[arg-type]

    monkeypatch.setattr(text_backend, "_canonical", counted)
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
