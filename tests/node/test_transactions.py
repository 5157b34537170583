"""Local nodes: transactions, views, history, the system root, policy and atomicity."""

from __future__ import annotations

from typing import Any

import pytest
from pycrdt import Doc
from pycrdt import Text as YText

import mycelia
from mycelia import Json, Model, Node, Ref, Text
from mycelia.entity import Snapshot
from mycelia.errors import (
    EntityNotFound,
    ForeignSystem,
    InvalidArgument,
    LocalProtocolError,
    PolicyDenied,
    SystemNotReady,
    TransactionClosed,
)
from mycelia.node import Credentials, PermissiveAgent
from mycelia.proto import AdmittedEvent, EntityId, EntityState
from mycelia.storage import MemoryStorage


class Artist(Model, collection="artists"):
    name: str


class Album(Model, collection="albums"):
    name: Text
    artist: str
    year: int
    rating: float | None = None
    meta: Json
    by: Ref[Artist] | None = None


async def durable_node(policy: object = None) -> Node:
    node = await Node.open(MemoryStorage(), durable=True, policy=policy)  # type: ignore[arg-type]
    await node.create_system()
    return node


async def test_create_edit_get_and_history_round_trip() -> None:
    node = await durable_node()
    ctx = node.context()
    async with ctx.transaction() as trx:
        prince = trx.create(Artist, name="Prince")
        album = trx.create(Album, name="Parade", artist="Prince", year=1986, meta={"k": [1]})
        album.by = Ref(prince.id)
        album.year = 1987
        assert album.year == 1987  # a transaction reads its own writes
    view = await ctx.get(Album, album.id)
    assert (str(view.name), view.artist, view.year, view.meta) == (
        "Parade",
        "Prince",
        1987,
        {"k": [1]},
    )
    assert view.by == prince.id
    assert view.rating is None
    history = await ctx.history(Album, album.id)
    assert [e.generation for e in history] == [1, 2]
    assert EntityId.of_genesis(history[0].id) == album.id  # the entity's id is its genesis id
    assert history[1].parent == mycelia.Clock([history[0].id])
    blob = history[1].to_bytes()
    assert mycelia.Event.from_bytes(blob) == history[1].event


async def test_text_fields_edit_by_character_even_outside_ascii() -> None:
    node = await durable_node()
    ctx = node.context()
    async with ctx.transaction() as trx:
        album = trx.create(Album, name="héllo 🌍", artist="a", year=1, meta=None)
    async with ctx.transaction() as trx:
        edit = await trx.edit(Album, album.id)
        edit.name.insert(6, "wide ")
        edit.name.delete(0, 1)
        edit.name.insert(0, "H")
        assert str(edit.name) == "Héllo wide 🌍"
    assert str((await ctx.get(Album, album.id)).name) == "Héllo wide 🌍"


async def test_repeatable_reads_inside_a_transaction() -> None:
    node = await durable_node()
    ctx = node.context()
    async with ctx.transaction() as trx:
        album = trx.create(Album, name="x", artist="a", year=1, meta=None)
    async with ctx.transaction() as reader:
        seen = await reader.edit(Album, album.id)
        async with ctx.transaction() as writer:
            (await writer.edit(Album, album.id)).year = 2
        assert seen.year == 1  # the fork was taken before the other commit
        seen.artist = "b"
    view = await ctx.get(Album, album.id)
    assert (view.year, view.artist) == (2, "b")  # both commits merged
    assert len(view.head) == 2  # concurrent edits: two tips


async def test_a_handle_used_after_commit_or_rollback_raises() -> None:
    node = await durable_node()
    trx = node.context().transaction()
    album = trx.create(Album, name="x", artist="a", year=1, meta=None)
    await trx.commit()
    with pytest.raises(TransactionClosed):
        album.year = 5
    with pytest.raises(TransactionClosed):
        _ = album.year
    with pytest.raises(TransactionClosed):
        await trx.commit()
    trx2 = node.context().transaction()
    await trx2.rollback()
    with pytest.raises(TransactionClosed):
        trx2.create(Album, name="x", artist="a", year=1, meta=None)


async def test_an_exception_inside_the_block_persists_nothing() -> None:
    node = await durable_node()
    before = await node.storage.last_offset()
    created = []

    async def fail_inside() -> None:
        async with node.context().transaction() as trx:
            created.append(trx.create(Album, name="x", artist="a", year=1, meta=None))
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        await fail_inside()
    album = created[0]
    assert await node.storage.last_offset() == before
    with pytest.raises(EntityNotFound):
        await node.context().get(Album, album.id)


class DenyNth(PermissiveAgent):
    """Denies the n-th event it is asked about (counting from 1)."""

    def __init__(self, n: int) -> None:
        self.n, self.seen = n, 0

    def check_event(
        self, credentials: Credentials, before: Snapshot, after: Snapshot, event: AdmittedEvent
    ) -> None:
        self.seen += 1
        if self.seen == self.n:
            raise PolicyDenied("not this one")


async def test_a_denial_on_the_second_of_three_entities_persists_nothing() -> None:
    node = await durable_node(DenyNth(2))
    before_offset = await node.storage.last_offset()
    trx = node.context().transaction()
    ids = [trx.create(Artist, name=f"a{i}").id for i in range(3)]
    with pytest.raises(PolicyDenied):
        await trx.commit()
    assert await node.storage.last_offset() == before_offset
    for entity_id in ids:
        assert await node.storage.events_of(entity_id) == []
        with pytest.raises(EntityNotFound):
            await node.context().get(Artist, entity_id)


async def test_bad_values_and_unknown_fields_are_refused_with_the_field_named() -> None:
    node = await durable_node()
    async with node.context().transaction() as trx:
        with pytest.raises(InvalidArgument, match="year"):
            trx.create(Album, name="x", artist="a", year="1986", meta=None)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="nope"):
            trx.create(Album, name="x", artist="a", year=1, meta=None, nope=1)  # type: ignore[call-arg]
        with pytest.raises(InvalidArgument, match="artist is required"):
            trx.create(Album, name="x", year=1, meta=None)  # type: ignore[call-arg]
        with pytest.raises(InvalidArgument, match="NaN"):
            trx.create(Album, name="x", artist="a", year=1, meta=float("nan"))
        album = trx.create(Album, name="x", artist="a", year=1, meta=None)
        with pytest.raises(InvalidArgument, match="bool"):
            album.year = True


async def test_views_are_read_only() -> None:
    node = await durable_node()
    async with node.context().transaction() as trx:
        album = trx.create(Album, name="x", artist="a", year=1, meta=None)
    view = await node.context().get(Album, album.id)
    with pytest.raises(InvalidArgument, match="read-only"):
        view.year = 2
    with pytest.raises(InvalidArgument, match="read-only"):
        view.name.insert(0, "y")


async def test_get_refuses_another_models_entity() -> None:
    node = await durable_node()
    async with node.context().transaction() as trx:
        artist = trx.create(Artist, name="x")
    with pytest.raises(EntityNotFound):
        await node.context().get(Album, artist.id)


async def test_reserved_collections_refuse_writes() -> None:
    with pytest.raises(InvalidArgument):

        class Sneaky(Model, collection="_mycelia_system"):
            x: int


async def test_the_system_root_binds_every_genesis_and_joining_is_checked() -> None:
    node = await durable_node()
    async with node.context().transaction() as trx:
        artist = trx.create(Artist, name="x")
    history = await node.context().history(Artist, artist.id)
    assert history[0].event.system == node.system_root
    # A node with no system cannot accept entities, and cannot create them.
    fresh = await Node.open(MemoryStorage(), durable=True)
    with pytest.raises(SystemNotReady):
        await fresh.ingest(history)
    async with fresh.context().transaction() as trx:
        with pytest.raises(SystemNotReady, match=r"create_system\(\) or join_system\(\)"):
            trx.create(Artist, name="y")
    await fresh.join_system(await node.system_events())
    await fresh.ingest(history)
    assert (await fresh.context().get(Artist, artist.id)).name == "x"
    # Another system's events are refused.
    other = await durable_node()
    with pytest.raises(ForeignSystem):
        await other.ingest(history)
    with pytest.raises(ForeignSystem):
        await other.join_system(await node.system_events())
    assert await other.storage.events_of(artist.id) == []


async def test_create_system_is_idempotent_and_durable_only() -> None:
    node = await durable_node()
    assert await node.create_system() == node.system_root
    ephemeral = await Node.open(MemoryStorage(), durable=False)
    with pytest.raises(LocalProtocolError):
        await ephemeral.create_system()


async def test_a_node_reopens_on_its_storage_with_its_system() -> None:
    storage = MemoryStorage()
    node = await Node.open(storage, durable=True)
    root = await node.create_system()
    again = await Node.open(storage, durable=True)
    assert again.system_root == root


class AlbumV2(Model, collection="albums"):
    name: Text
    artist: str
    year: int
    label: str | None  # added later: optional
    rating: float | None


async def test_adding_an_optional_field_keeps_old_entities_readable_and_unknown_fields_kept() -> (
    None
):
    node = await durable_node()
    async with node.context().transaction() as trx:
        old = trx.create(Album, name="x", artist="a", year=1, meta={"keep": True})
    v2 = await node.context().get(AlbumV2, old.id)
    assert v2.label is None
    async with node.context().transaction() as trx:
        (await trx.edit(AlbumV2, old.id)).label = "L"
    v1 = await node.context().get(Album, old.id)
    assert v1.meta == {"keep": True}  # v2 does not know `meta`; it was kept
    assert (await node.context().get(AlbumV2, old.id)).label == "L"


async def test_node_open_is_also_an_async_context_manager() -> None:
    async with Node.open(MemoryStorage(), durable=True) as node:
        await node.create_system()
        assert node.system_root is not None


async def test_a_deleted_entity_is_gone_from_reads_and_stays_deleted_after_concurrent_edits() -> (
    None
):
    node = await durable_node()
    ctx = node.context()
    async with ctx.transaction() as trx:
        artist = trx.create(Artist, name="x")
    async with ctx.transaction() as editor:
        handle = await editor.edit(Artist, artist.id)  # forked before the delete
        async with ctx.transaction() as deleter:
            await deleter.delete(Artist, artist.id)
        handle.name = "concurrent edit"
    with pytest.raises(EntityNotFound):
        await ctx.get(Artist, artist.id)
    assert await ctx.fetch(Artist, "") == []
    with pytest.raises(EntityNotFound):
        async with ctx.transaction() as trx:
            await trx.edit(Artist, artist.id)
    replica = await Node.open(MemoryStorage(), durable=True)
    await replica.join_system(await node.system_events())
    await replica.ingest(await node.storage.events_of(artist.id))
    with pytest.raises(EntityNotFound):
        await replica.context().get(Artist, artist.id)


async def test_a_transaction_that_only_deletes_text_persists_the_deletion() -> None:
    # A deletion does not move the Yrs state vector; the edit must still become an event.
    node = await durable_node()
    async with node.context().transaction() as trx:
        album = trx.create(Album, name="hello world", artist="a", year=1, meta=None)
    async with node.context().transaction() as trx:
        (await trx.edit(Album, album.id)).name.delete(5, 6)
    assert str((await node.context().get(Album, album.id)).name) == "hello"
    replica = await Node.open(MemoryStorage(), durable=True)
    await replica.join_system(await node.system_events())
    await replica.ingest(await node.context().history(Album, album.id))
    assert str((await replica.context().get(Album, album.id)).name) == "hello"


class Folder(Model, collection="folders"):
    name: str
    parent: Ref[Folder] | None = None


async def test_a_model_may_refer_to_itself() -> None:
    node = await durable_node()
    async with node.context().transaction() as trx:
        root = trx.create(Folder, name="root")
        child = trx.create(Folder, name="child", parent=root)  # type: ignore[arg-type]
    view = await node.context().get(Folder, child.id)
    assert view.parent == root.id
    assert isinstance(view.parent, Ref)


def _text_state(state: object) -> tuple[str, int, bytes]:
    """(text, number of Yrs clients, the stored text buffer) of an EntityState."""
    assert isinstance(state, EntityState)
    buffer = state.state.buffer("text")
    assert buffer is not None
    doc: Doc[Any] = Doc()
    doc.apply_update(buffer)
    clients = doc.get_state()[0]  # the state vector starts with its number of clients
    return str(doc.get("name", type=YText)), clients, buffer


async def test_text_client_ids_are_reused_and_states_stay_byte_identical() -> None:
    # Each transaction leases a Yrs client id and gives it back once its edits are
    # published here (or rolled back), so typing in many transactions leaves one client
    # in the document; Yrs then squashes consecutive items depending on how updates
    # arrive, and the stored state is re-encoded canonically so replicas still agree.
    node = await durable_node()
    ctx = node.context()
    async with ctx.transaction() as trx:
        album = trx.create(Album, name="", artist="a", year=1, meta=None)
    for word in ("typing ", "in ", "many ", "transactions"):
        async with ctx.transaction() as trx:
            name = (await trx.edit(Album, album.id)).name
            name.insert(len(str(name)), word)
    async with ctx.transaction() as trx:
        (await trx.edit(Album, album.id)).name.insert(0, "never ")
        await trx.rollback()
    async with ctx.transaction() as first, ctx.transaction() as second:
        (await first.edit(Album, album.id)).name.insert(0, "> ")
        (await second.edit(Album, album.id)).name.insert(0, "# ")
    text, clients, mine = _text_state(await node.storage.get_state(album.id))
    assert text in ("# > typing in many transactions", "> # typing in many transactions")
    assert clients == 2  # the two concurrent transactions held different ids

    history = await ctx.history(Album, album.id)
    orders = {
        "one by one": [[e] for e in history],
        "one batch": [history],
        "children first": [list(reversed(history))],
        "pairs": [history[i : i + 2] for i in range(0, len(history), 2)],
    }
    for order, batches in orders.items():
        replica = await Node.open(MemoryStorage(), durable=True)
        await replica.join_system(await node.system_events())
        for batch in batches:
            await replica.ingest(batch)
        assert _text_state(await replica.storage.get_state(album.id)) == (text, 2, mine), order
