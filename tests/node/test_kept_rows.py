"""A mirrored live query shows only rows its server keeps current for it
(mycelia.node.kept).

A client holds rows the server no longer tells it about: one read once with ``ctx.get``,
one that fell out of a LIMIT before a reconnect. A live query read its result from every
row held here, so such a row, stale, showed with its old values for good: opened after
the read, or brought back by a LIMIT refill (found by a soak of two servers on one
PostgreSQL, 3 runs of 66). Each test below failed so before.
"""

from __future__ import annotations

from mycelia import Model, Node
from mycelia.node.inprocess import InProcessServer
from mycelia.node.live import LiveQuery
from mycelia.proto import EntityId
from tests.node.waiting import until

TOP_TWO = "n > 0 ORDER BY n DESC LIMIT 2"


class Score(Model, collection="scores"):
    n: int = 0


async def _scores(node: Node, *ns: int) -> list[EntityId]:
    async with node.context().transaction() as trx:
        return [trx.create(Score, n=n).id for n in ns]


async def _set(node: Node, entity_id: EntityId, n: int) -> None:
    async with node.context().transaction() as trx:
        (await trx.edit(Score, entity_id)).n = n


async def _shows(client: Node, live: LiveQuery[Score], *ids: EntityId) -> None:
    """Wait until ``live`` shows exactly ``ids`` (at most 5 s: else, what it shows)."""

    async def shown() -> bool:
        await live.wait_settled()
        return set(live.member_ids()) == set(ids)

    try:
        await until(client, shown, timeout=5)
    except TimeoutError:
        assert set(live.member_ids()) == set(ids)  # (says what it shows instead)


async def test_a_query_opened_after_a_read_does_not_show_the_stale_row(
    in_process: tuple[Node, Node],
) -> None:
    server_node, client = in_process
    stale, fresh = await _scores(server_node, 5, 6)
    assert (await client.context().get(Score, stale)).n == 5
    await _set(server_node, stale, 50)  # the client is not told: nothing keeps it current
    async with client.context().query(Score, "n < ?", 10) as live:
        assert live.member_ids() == [fresh]  # (before: the stale row too, for good)


async def test_a_limit_refill_skips_a_row_read_once(in_process: tuple[Node, Node]) -> None:
    server_node, client = in_process
    first, second, third, stale = await _scores(server_node, 300, 200, 150, 160)
    async with client.context().query(Score, TOP_TWO) as live:
        assert set(live.member_ids()) == {first, second}
        assert (await client.context().get(Score, stale)).n == 160
        await _set(server_node, stale, 10)  # out of the LIMIT: the client is not told
        await _set(server_node, first, -1)  # makes room
        await _shows(client, live, second, third)  # (before: the stale row, at 160)


async def test_a_limit_refill_after_a_reconnect_skips_a_row_that_left_it(
    in_process_server: tuple[Node, InProcessServer, Node],
) -> None:
    server_node, server, client = in_process_server
    first, second, third, stale = await _scores(server_node, 300, 200, 150, 400)
    async with client.context().query(Score, TOP_TWO) as live:
        await _set(server_node, stale, 160)  # leaves the LIMIT: kept current while connected
        await _shows(client, live, first, second)
        await server.drop()  # the new subscription names the members only
        await client.wait_ready(timeout=10)
        await _set(server_node, stale, 10)  # the client is not told
        await _set(server_node, first, -1)  # makes room
        await _shows(client, live, second, third)  # (before: the stale row, at 160)


async def test_a_limit_refill_keeps_a_row_this_client_created(
    in_process: tuple[Node, Node],
) -> None:
    # The server keeps a subscriber's own create current for its query without sending it
    # back: it says so with a matches=True delta carrying no data, or a refill ranking only
    # what the client knows is kept would leave the create out.
    server_node, client = in_process
    first, second, _ = await _scores(server_node, 300, 200, 150)
    async with client.context().query(Score, TOP_TWO) as live:
        async with client.context().transaction(wait="peer") as trx:
            mine = trx.create(Score, n=250).id
        await _shows(client, live, first, mine)
        await _set(server_node, first, -1)  # makes room: the create and the second
        await _shows(client, live, mine, second)


async def test_an_own_edit_the_server_merged_away_leaves_the_query(
    in_process: tuple[Node, Node],
) -> None:
    """The client's own edit matches its query, but a concurrent edit it never saw wins
    the merge on the server: the server tells it, though the query never held the row (the
    live-query soak: a writer's query showed its own write at 49, the server held 408)."""
    server_node, client = in_process
    (row,) = await _scores(server_node, 500)
    async with client.context().query(Score, "n < ?", 97) as live:
        async with client.context().transaction() as trx:
            mine = await trx.edit(Score, row)  # read at 500 (asked of the server)
            await _set(server_node, row, 300)
            await _set(server_node, row, 408)  # two generations on: it wins the merge
            mine.n = 49  # the client's query shows it at once
        assert (await server_node.context().get(Score, row)).n == 408
        await _shows(client, live)  # (before: the row at 49, for good)
        assert (await client.context().get(Score, row)).n == 408
