"""A commit made while a subscription is being answered reaches the subscriber
(mycelia.node.serving, mycelia.node.served): the answer reads the rows, the commit
lands, and only then does the query stand. Before, the peer kept the row as read until
the entity's next change."""

from __future__ import annotations

from typing import Any

import pytest

from mycelia import Model, Node
from tests.node.waiting import until


class Lamp(Model, collection="lamps"):
    lit: bool = False


@pytest.mark.parametrize("query", ["", "LIMIT 10"], ids=["streamed", "ranked"])
async def test_a_commit_made_while_the_answer_is_built_is_pushed_after_it(
    in_process: tuple[Node, Node], monkeypatch: pytest.MonkeyPatch, query: str
) -> None:
    """Both kinds of answer: read a page at a time (no LIMIT), or ranked first."""
    server_node, client = in_process
    async with server_node.context().transaction() as trx:
        lamp = trx.create(Lamp).id
    storage = server_node.storage
    fetch = storage.fetch
    committed: list[bool] = []

    async def rows_then_a_commit(*args: Any, **kwargs: Any) -> Any:
        rows = await fetch(*args, **kwargs)
        if not committed:  # the rows are read: now a commit lands before the query stands
            committed.append(True)
            async with server_node.context().transaction() as trx:
                (await trx.edit(Lamp, lamp)).lit = True
        return rows

    monkeypatch.setattr(storage, "fetch", rows_then_a_commit)
    live = await client.context().query(Lamp, query).__aenter__()
    try:

        async def lit() -> bool:
            return [x.lit for x in live.items] == [True]

        await until(client, lit)
        assert committed
        want = (await server_node.context().get(Lamp, lamp)).head
        assert [x.head for x in live.items] == [want]
    finally:
        await live.close()
