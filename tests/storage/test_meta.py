"""The meta records a dump carries (mycelia.storage.meta) are the ones nodes write."""

from __future__ import annotations

import io

import pytest

from mycelia import Model, Node
from mycelia.entity.unsure import UNSURE_PREFIX, unsure_record
from mycelia.errors import DecodeError
from mycelia.node.identity import KEY_META
from mycelia.node.node import ROOT_KEY
from mycelia.node.outbox import LEGACY_OUTBOX, OUTBOX_PREFIX
from mycelia.proto import EntityId
from mycelia.storage import MemoryStorage
from mycelia.storage.dump import dump_to, load_from
from mycelia.storage.meta import (
    META_FORMATS,
    META_PREFIXES,
    NODE_KEY,
    OUTBOX,
    SYSTEM_ROOT,
    check_meta,
)
from mycelia.storage.testing import engine_content


class Memo(Model, collection="memos"):
    text: str


def test_the_checked_records_are_named_as_the_node_names_them() -> None:
    assert (NODE_KEY, SYSTEM_ROOT, OUTBOX) == (KEY_META, ROOT_KEY, LEGACY_OUTBOX)
    assert set(META_FORMATS) == {KEY_META, ROOT_KEY, LEGACY_OUTBOX}
    assert set(META_PREFIXES) == {OUTBOX_PREFIX, UNSURE_PREFIX}


def test_an_unsure_head_s_record_names_an_entity_and_holds_nothing() -> None:
    entity_id = EntityId(bytes(range(32)))
    key, value = unsure_record(entity_id)
    assert value is not None
    check_meta(key, value)
    assert unsure_record(entity_id, settled=True) == (key, None)


async def test_every_record_an_offline_ephemeral_node_writes_passes_its_check() -> None:
    server = await Node.open(MemoryStorage(), durable=True)
    await server.create_system()
    client = await Node.open(MemoryStorage(), durable=False)
    await client.join_system(await server.system_events())
    async with client.context().transaction() as trx:  # no peer: the commit is owed
        trx.create(Memo, text="owed")
    records = await client.storage.scan_meta("")
    assert {key for key, _ in records} == {KEY_META, ROOT_KEY, f"{OUTBOX_PREFIX}{1:020d}"}
    for key, value in records:
        check_meta(key, value)
    out = io.BytesIO()
    await dump_to(client.storage, out)
    copy = MemoryStorage()
    await load_from(io.BytesIO(out.getvalue()), copy, durable=False)
    assert (await engine_content(copy))[:-2] == (await engine_content(client.storage))[:-2]


@pytest.mark.parametrize(
    ("key", "value"),
    [(NODE_KEY, b"ab"), (NODE_KEY, b"k" * 33), (SYSTEM_ROOT, b""), (OUTBOX, b"\xc1"),
     (OUTBOX, b"\x91\xa1x"), (f"outbox/{1:020d}", b"\x91\x92\x00\xa1x"),
     ("outbox/1", b"\x90"), ("unknown", b""), ("unsure/" + "A" * 43, b"x"),
     ("unsure/not-an-id", b"")],
)  # fmt: skip
def test_a_malformed_record_is_refused_naming_it(key: str, value: bytes) -> None:
    with pytest.raises(DecodeError, match=key):
        check_meta(key, value)
