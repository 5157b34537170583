"""Forty clients at once, each with live queries open, editing shared entities and one text.

This is what broke before the client side was rebuilt: commits the server took raised on
the client (``EventNotFound``), so an app that retried duplicated text. It runs twice:
deterministically, over memory transports (:class:`InProcessServer`), and over real
websockets against a real ``mycelia serve`` process. It must show no commit error, every
acknowledged text insert exactly once, and every client's live view equal to a fresh
client's fetch. A third run, against ``mycelia serve`` too, does it on a 50,000-character
text, with deletes and commits left in flight, at five times the edits (about 10 s).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal, NamedTuple

import mycelia
from mycelia import Model, Node, Text
from mycelia.node.inprocess import InProcessServer
from mycelia.node.live import LiveQuery
from mycelia.storage import MemoryStorage
from tests.cli.test_serve_process import start_server

CLIENTS = 40
EDITS = 8
SHARED = 20


class Item(Model, collection="items"):
    label: str = ""
    count: int = 0


class Pad(Model, collection="pads"):
    body: Text


Attach = Callable[[Node], Awaitable[None]]


async def _clients(attach: Attach, n: int) -> list[Node]:
    nodes = []
    for _ in range(n):
        node = await Node.open(MemoryStorage(), durable=False)
        await attach(node)
        nodes.append(node)
    await asyncio.gather(*(node.wait_ready(timeout=30) for node in nodes))
    return nodes


async def _seed(attach: Attach, filler: str) -> tuple[list[mycelia.EntityId], mycelia.EntityId]:
    """The shared items, and the pad holding ``filler``."""
    (author,) = await _clients(attach, 1)
    async with author.context().transaction() as trx:
        items = [trx.create(Item, label=f"i{i}").id for i in range(SHARED)]
        pad = trx.create(Pad, body="").id
    for start in range(0, len(filler), 10_000):  # as a paste in pieces would come
        async with author.context().transaction() as trx:
            body = (await trx.edit(Pad, pad)).body
            body.insert(start, filler[start : start + 10_000])
    await author.close()
    return items, pad


class Edits(NamedTuple):
    """What one client did: the tokens it inserted, the filler characters it deleted."""

    tokens: list[str]
    deleted: int


async def _edit(
    node: Node,
    index: int,
    items: list[mycelia.EntityId],
    pad: mycelia.EntityId,
    *,
    edits: int,
    filler: int,
) -> Edits:
    """``edits`` edits, alternating an LWW set and a text insert (with ``filler``, every
    other insert also deletes the pad's last character: filler, as tokens go before it).
    Every commit is awaited until the server confirmed it, but with ``filler`` one in three
    only once all are made (``wait="local"``, as an editor does)."""
    rng = random.Random(f"many-clients/{index}")
    tokens: list[str] = []
    deleted = 0
    pending = []
    for step in range(edits):
        wait: Literal["local", "peer"] = "local" if filler and step % 3 == 0 else "peer"
        async with node.context().transaction(wait=wait) as trx:
            if step % 2 == 0:
                item = await trx.edit(Item, items[rng.randrange(len(items))])
                item.label, item.count = f"c{index}s{step}", index * 100 + step
            else:
                token = f"<{index}.{step}>"
                handle = await trx.edit(Pad, pad)
                text = str(handle.body)
                cuts = [0] + [i + 1 for i, ch in enumerate(text) if ch == ">"]
                handle.body.insert(rng.choice(cuts), token)  # between tokens, never inside one
                tokens.append(token)
                after = handle.body  # (a Text is a snapshot: read the field again)
                if filler and step % 4 == 1 and not after.endswith(">"):
                    after.delete(len(after) - 1, 1)
                    deleted += 1
        pending.append(trx)
        await asyncio.sleep(0)  # yield between edits, as an app's event loop would
    for trx in pending:
        await trx.confirmed()
    return Edits(tokens, deleted)


async def _until_equal(live: LiveQuery[Model], want: list[Model], timeout: float = 60) -> None:
    async with asyncio.timeout(timeout):
        while live.items != want:
            await anext(aiter(live))


async def _run(attach: Attach, *, edits: int = EDITS, filler: int = 0) -> None:
    """``edits`` per client (see :func:`_edit`) on a pad holding ``filler`` characters."""
    filling = "".join(random.Random("many-clients/filler").choices("abcdefgh \n", k=filler))
    items, pad = await _seed(attach, filling)
    nodes = await _clients(attach, CLIENTS)
    lives = []
    for node in nodes:
        ctx = node.context()
        item_query = await ctx.query(Item, "").__aenter__()
        pad_query = await ctx.query(Pad, "").__aenter__()
        lives.append((item_query, pad_query))
    try:
        outcomes = await asyncio.gather(
            *(
                _edit(node, i, items, pad, edits=edits, filler=filler)
                for i, node in enumerate(nodes)
            ),
            return_exceptions=True,
        )
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        assert errors == [], f"{len(errors)} of {CLIENTS} clients got commit errors: {errors[:3]}"
        done = [o for o in outcomes if isinstance(o, Edits)]
        tokens = [t for o in done for t in o.tokens]
        (fresh,) = await _clients(attach, 1)
        want_items = await fresh.context().fetch(Item, "")
        want_pads = await fresh.context().fetch(Pad, "")
        text = str(want_pads[0].body)
        assert len(tokens) == CLIENTS * edits // 2
        assert [t for t in tokens if text.count(t) != 1] == []  # every insert exactly once
        inserted = sum(len(t) for t in tokens)  # every token goes before the filler, and
        rest = text[inserted:]  # the deletes take the filler's last characters
        assert rest == filling[: len(rest)]  # so nothing else is there
        assert len(rest) >= filler - sum(o.deleted for o in done)  # (two may take one)
        for item_query, pad_query in lives:
            await _until_equal(item_query, want_items)  # type: ignore[arg-type]
            await _until_equal(pad_query, want_pads)  # type: ignore[arg-type]
        await fresh.close()
    finally:
        for item_query, pad_query in lives:
            await item_query.close()
            await pad_query.close()
        for node in nodes:
            await node.close()


async def test_forty_clients_over_memory_transports_lose_and_duplicate_nothing() -> None:
    server_node = await Node.open(MemoryStorage(), durable=True)
    await server_node.create_system()
    server = InProcessServer(server_node)

    async def attach(node: Node) -> None:
        server.connect(node)

    try:
        await _run(attach)
    finally:
        await server.close()
        await server_node.close()


async def _run_served(data: Path, *, edits: int = EDITS, filler: int = 0) -> None:
    """:func:`_run` against a real ``mycelia serve`` process on ``data``."""
    process, url = await start_server(data)

    async def attach(node: Node) -> None:
        await mycelia.connect(node, url)

    try:
        await _run(attach, edits=edits, filler=filler)
    finally:
        process.terminate()
        await process.wait()


async def test_forty_clients_against_a_real_mycelia_serve_lose_and_duplicate_nothing(
    tmp_path: Path,
) -> None:
    await _run_served(tmp_path / "data")


async def test_forty_clients_editing_a_long_text_on_a_real_mycelia_serve_converge(
    tmp_path: Path,
) -> None:
    await _run_served(tmp_path / "data", edits=5 * EDITS, filler=50_000)
