"""Text forks take the resident's spare document and give it back (ARCHITECTURE.md §5)."""

from __future__ import annotations

from typing import Any

import pycrdt
import pytest

from mycelia import Model, Node, Text
from mycelia.proto import State
from mycelia.storage import MemoryStorage


class Note(Model, collection="notes"):
    body: Text


async def _node() -> Node:
    node = await Node.open(MemoryStorage(), durable=True)
    await node.create_system()
    return node


def _count_applied(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on, the id of each document a Yrs update is applied to, in order."""
    applied: list[int] = []
    original = pycrdt.Doc.apply_update

    def counted(doc: pycrdt.Doc[Any], update: bytes) -> None:
        applied.append(id(doc))
        original(doc, update)

    monkeypatch.setattr(pycrdt.Doc, "apply_update", counted)
    return applied


async def test_sequential_and_concurrent_text_transactions_keep_every_edit() -> None:
    node = await _node()
    ctx = node.context()
    async with ctx.transaction() as trx:
        note_id = trx.create(Note, body="ab").id
    for i in range(5):  # the second fork on takes the spare, the commit gives it back
        async with ctx.transaction() as trx:
            (await trx.edit(Note, note_id)).body.insert(0, str(i))
    first, second = ctx.transaction(), ctx.transaction()
    (await first.edit(Note, note_id)).body.insert(0, "X")  # holds the spare
    (await second.edit(Note, note_id)).body.insert(0, "Y")  # copies the document
    await second.commit()
    await first.commit()  # made on an older head: taken back and brought up to date
    rolled = ctx.transaction()
    (await rolled.edit(Note, note_id)).body.insert(0, "Z")
    await rolled.rollback()  # its document is dropped
    async with ctx.transaction() as trx:
        (await trx.edit(Note, note_id)).body.insert(0, "!")
    text = str((await ctx.get(Note, note_id)).body)
    assert sorted(text) == sorted("!XY43210ab")
    assert text.endswith("43210ab")
    assert text.startswith("!")
    # A replica given the same events holds the same canonical buffer.
    replica = await Node.open(MemoryStorage(), durable=True)
    await replica.join_system(await node.system_events())
    await replica.ingest(await ctx.history(Note, note_id))
    ours = await node.storage.get_state(note_id)
    theirs = await replica.storage.get_state(note_id)
    assert ours is not None
    assert theirs is not None
    assert ours.state == theirs.state
    assert str((await replica.context().get(Note, note_id)).body) == text


async def test_a_lazy_state_buffer_is_the_canonical_one() -> None:
    node = await _node()
    ctx = node.context()
    async with ctx.transaction() as trx:
        note_id = trx.create(Note, body="").id
    for i in range(40):
        async with ctx.transaction() as trx:
            (await trx.edit(Note, note_id)).body.insert(i // 2, "xy"[i % 2])
    stored = await node.storage.get_state(note_id)
    assert stored is not None
    rebuilt = State(stored.state.head, stored.state.generations, stored.state.buffers)
    fresh = await Node.open(MemoryStorage(), durable=True)
    await fresh.join_system(await node.system_events())
    await fresh.ingest(await ctx.history(Note, note_id))
    again = await fresh.storage.get_state(note_id)
    assert again is not None
    assert again.state == rebuilt


async def test_a_committed_fork_s_document_becomes_the_spare_without_its_own_diff_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Taking a fork's document back applied the fork's own diff to it once more (a no-op
    for Yrs, one more update a keystroke); only what came between is applied."""
    node = await _node()
    ctx = node.context()
    async with ctx.transaction() as trx:
        note_id = trx.create(Note, body="ab").id
    for i in range(2):  # the second fork takes the spare the first one gave back
        async with ctx.transaction() as trx:
            (await trx.edit(Note, note_id)).body.insert(0, str(i))
    applied = _count_applied(monkeypatch)
    async with ctx.transaction() as trx:
        (await trx.edit(Note, note_id)).body.insert(0, "X")
    assert len(applied) == 1, "the resident's document only"
    # A fork holds the spare while a peer's edit is applied: when it commits, its
    # document comes back and is brought up to date with that edit (and only that one).
    other = await Node.open(MemoryStorage(), durable=True)
    await other.join_system(await node.system_events())
    await other.ingest(await ctx.history(Note, note_id))
    async with other.context().transaction() as trx:
        (await trx.edit(Note, note_id)).body.insert(0, "P")
    between = ctx.transaction()
    (await between.edit(Note, note_id)).body.insert(0, "Y")  # takes the spare
    await node.ingest(await other.context().history(Note, note_id))
    applied.clear()
    await between.commit()
    assert len(applied) == 1, "the resident's: the document coming back is behind"
    applied.clear()
    async with ctx.transaction() as trx:  # takes the spare that came back
        (await trx.edit(Note, note_id)).body.insert(0, "!")
        assert len(applied) == 1, "the peer's edit, brought to the spare as it is taken"
    monkeypatch.undo()
    text = str((await ctx.get(Note, note_id)).body)
    assert sorted(text) == sorted("!YPX10ab")
    replica = await Node.open(MemoryStorage(), durable=True)
    await replica.join_system(await node.system_events())
    await replica.ingest(await ctx.history(Note, note_id))
    assert str((await replica.context().get(Note, note_id)).body) == text
    ours, theirs = await node.storage.get_state(note_id), await replica.storage.get_state(note_id)
    assert ours is not None
    assert theirs is not None
    assert ours.state == theirs.state


async def test_remote_edits_are_applied_once_and_the_spare_catches_up_when_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A subscriber that edits now and then holds a spare: a peer's edits are applied to
    the resident's document only, and the next fork brings the spare up to date in one
    update, with every edit in it."""
    node = await _node()
    ctx = node.context()
    async with ctx.transaction() as trx:
        note_id = trx.create(Note, body="ab").id
    for i in range(2):  # the spare comes back with the second commit
        async with ctx.transaction() as trx:
            (await trx.edit(Note, note_id)).body.insert(0, str(i))
    other = await Node.open(MemoryStorage(), durable=True)
    await other.join_system(await node.system_events())
    await other.ingest(await ctx.history(Note, note_id))
    for piece in "PQR":
        async with other.context().transaction() as trx:
            (await trx.edit(Note, note_id)).body.insert(0, piece)
    applied = _count_applied(monkeypatch)
    await node.ingest(await other.context().history(Note, note_id))
    assert len(applied) == 3, "each of the peer's edits, to the resident's document only"
    assert len(set(applied)) == 1
    applied.clear()
    async with ctx.transaction() as trx:
        body = (await trx.edit(Note, note_id)).body
        assert len(applied) == 1, "the spare, caught up in one update"
        assert str(body) == "RQP10ab"
        body.insert(7, "!")
    monkeypatch.undo()
    assert str((await ctx.get(Note, note_id)).body) == "RQP10ab!"
    await other.ingest(await ctx.history(Note, note_id))
    ours, theirs = await node.storage.get_state(note_id), await other.storage.get_state(note_id)
    assert ours is not None
    assert theirs is not None
    assert ours.state == theirs.state


async def test_non_ascii_edits_keep_the_cached_text_equal_to_the_document() -> None:
    """Edits of a non-ASCII text keep the cached text by characters (no re-encoding of the
    whole document): after each, the view, the handle and a fresh read of the Yrs document
    all equal a plain Python model of the edits."""
    import random  # noqa: PLC0415 - this test only

    rng = random.Random(7)
    alphabet = "aé漢😀 "
    node = await _node()
    ctx = node.context()
    model = "é😀a"
    async with ctx.transaction() as trx:
        note_id = trx.create(Note, body=model).id
    for _ in range(300):
        async with ctx.transaction() as trx:
            handle = await trx.edit(Note, note_id)
            for _ in range(rng.randint(1, 3)):
                if model and rng.random() < 0.35:
                    at = rng.randrange(len(model))
                    length = rng.randint(1, min(4, len(model) - at))
                    handle.body.delete(at, length)
                    model = model[:at] + model[at + length :]
                else:
                    at = rng.randint(0, len(model))
                    piece = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
                    handle.body.insert(at, piece)
                    model = model[:at] + piece + model[at:]
                assert str(handle.body) == model
        assert str((await ctx.get(Note, note_id)).body) == model
    entity = node._residents.get(note_id)  # the resident's own document, read again
    assert entity is not None
    assert str(entity.text().text("body")) == model


async def test_text_utf8_cannot_encode_is_refused_with_a_typed_error() -> None:
    """A lone surrogate reached Yrs, which raised a bare UnicodeEncodeError."""
    from mycelia.errors import InvalidArgument  # noqa: PLC0415 - this test only

    node = await _node()
    ctx = node.context()
    async with ctx.transaction() as trx:
        note_id = trx.create(Note, body="ab").id
    with pytest.raises(InvalidArgument, match="lone surrogate at character 1"):
        async with ctx.transaction() as trx:
            (await trx.edit(Note, note_id)).body.insert(1, "x\ud800")
    with pytest.raises(InvalidArgument, match="lone surrogate"):
        async with ctx.transaction() as trx:
            trx.create(Note, body="é\udfff")
    assert str((await ctx.get(Note, note_id)).body) == "ab"
