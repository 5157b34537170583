"""Queries are checked against the model: a typo or a wrong-typed value is a QueryError
that says what is wrong, never a silently wrong result (issue 17)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from mycelia import Json, Model, Node, Text
from mycelia.errors import QueryError
from mycelia.node.inprocess import InProcessServer
from mycelia.storage import MemoryStorage


class Note(Model, collection="notes"):
    title: str
    seq: int
    body: Text = Text()
    meta: Json = None


class NoteV2(Model, collection="notes"):
    """A later version of the app's model: it declares a field the server never checks."""

    title: str
    seq: int
    label: str | None = None


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    node = await Node.open(MemoryStorage(), durable=True)
    await node.create_system()
    async with node.context().transaction() as trx:
        for seq in range(3):
            trx.create(Note, title=f"t{seq}", seq=seq, meta={"author": "ann"})
    yield node
    await node.close()


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("titel = 't0'", "Note has no field 'titel' (in WHERE) (did you mean 'title'?)"),
        ("nosuchfield IS NULL", "Note has no field 'nosuchfield' (in WHERE)"),
        ("seq > 0 ORDER BY sqe", "Note has no field 'sqe' (in ORDER BY) (did you mean 'seq'?)"),
        ("seq IN (1, 'x')", "Note.seq holds numbers, so the literal 'x' (a str) never matches"),
        ("seq > '5'", "Note.seq holds numbers, so the literal '5' (a str) never matches it"),
        ("title = 5", "Note.title holds strings, so the literal 5 (a int) never matches it"),
        ("title.first = 'x'", "Note.title holds strings, which have no sub-field 'first'"),
        ("seq = title", "Note.seq holds numbers and Note.title strings"),
    ],
)
async def test_a_query_that_does_not_fit_the_model_says_why(
    node: Node, query: str, says: str
) -> None:
    with pytest.raises(QueryError) as refused:
        await node.context().fetch(Note, query)
    assert says in str(refused.value), str(refused.value)
    assert "its fields are: title, seq, body, meta" in str(refused.value) or "holds" in says
    with pytest.raises(QueryError):
        node.context().query(Note, query)


async def test_an_argument_of_the_wrong_type_is_named_by_its_position(node: Node) -> None:
    with pytest.raises(QueryError, match=r"argument 2 '5' \(a str\) never matches"):
        await node.context().fetch(Note, "title = ? AND seq > ?", "t1", "5")
    async with node.context().query(Note, "seq >= ?", 0) as live:
        with pytest.raises(QueryError, match="argument 1"):
            await live.update_query("seq >= ?", "0")
        assert live.args == (0,)  # the query is left as it was


async def test_queries_that_fit_still_answer_as_before(node: Node) -> None:
    ctx = node.context()
    assert [v.seq for v in await ctx.fetch(Note, "seq > ? ORDER BY seq DESC", 0)] == [2, 1]
    assert len(await ctx.fetch(Note, "meta.author = 'ann'")) == 3  # into Json: not checked
    assert len(await ctx.fetch(Note, "seq > 0.5")) == 2  # ints and floats are both numbers
    assert len(await ctx.fetch(Note, "title IS NULL OR title = NULL")) == 0  # NULL is allowed


async def test_raw_queries_from_the_wire_keep_the_language_semantics(node: Node) -> None:
    """The server has no model for a client's query: a field it never heard of is null."""
    server = InProcessServer(node)
    app = await Node.open(MemoryStorage(), durable=False)
    server.connect(app)
    await app.wait_ready(timeout=10)
    fetched = await app.context().fetch(NoteV2, "label IS NULL ORDER BY seq")
    assert [v.seq for v in fetched] == [0, 1, 2]
    await app.close()
    await server.close()


@pytest.mark.parametrize(
    ("query", "args", "what"),
    [
        ("title = ?", ("x" * 70_000,), "argument 1 has 70,000 bytes"),
        ("body = ?", ("é" * 40_000,), "argument 1 has 80,000 bytes"),  # a Text field too
        ("meta.author IN ('a', ?)", ("x" * 65_537,), "argument 1 has 65,537 bytes"),
    ],
)
async def test_a_query_string_longer_than_a_server_decodes_is_refused_here(
    node: Node, query: str, args: tuple[object, ...], what: str
) -> None:
    """Before, the server refused the query's frame: a live query showed only what the
    client held (a warning in the log), and a fetch raised the peer's PayloadTooLarge. (A
    literal cannot be that long: the parser takes at most as many characters.)"""
    with pytest.raises(QueryError, match=f"{what} of UTF-8, and a query's string may hold"):
        await node.context().fetch(Note, query, *args)
    with pytest.raises(QueryError, match=what):
        node.context().query(Note, query, *args)
    assert await node.context().fetch(Note, "title = ?", "x" * 65_536) == []  # at the limit
