"""A todo list shared by two clients through one server (run: python examples/todo_two_clients.py).

Ann adds todos; Bob's live query shows them as they arrive, he ticks one off, and Ann's
live query sees that. Every wait has a timeout, so with no server it fails with a message
(ConnectTimeout) instead of hanging.
"""

from __future__ import annotations

import asyncio

import mycelia
from mycelia import Model, Node
from mycelia.storage import MemoryStorage


class Todo(Model, collection="todos"):
    title: str
    done: bool = False


async def client(url: str) -> Node:
    node = await Node.open(MemoryStorage(), durable=False)  # LmdbStorage(path) to keep it
    await mycelia.connect(node, url)
    await node.wait_ready(timeout=10)
    return node


async def main() -> None:
    server_node = await Node.open(MemoryStorage(), durable=True)
    await server_node.create_system()
    async with await mycelia.serve(server_node, host="127.0.0.1", port=0) as server:
        ann, bob = await client(server.url), await client(server.url)
        async with (
            ann.context().query(Todo, "done = FALSE ORDER BY title") as ann_open,
            bob.context().query(Todo, "ORDER BY title") as bob_all,
        ):
            ann_changes, bob_changes = aiter(ann_open), aiter(bob_all)
            await anext(ann_changes)  # the initial (empty) results
            await anext(bob_changes)
            async with ann.context().transaction() as trx:
                trx.create(Todo, title="buy milk")
                trx.create(Todo, title="water plants")
            while len(bob_all.items) < 2:
                await asyncio.wait_for(anext(bob_changes), 10)
            print("bob sees:", [t.title for t in bob_all.items])
            async with bob.context().transaction() as trx:
                milk = await trx.edit(Todo, bob_all.items[0].id)
                milk.done = True
            while len(ann_open.items) != 1:
                await asyncio.wait_for(anext(ann_changes), 10)
            print("ann still has to:", [t.title for t in ann_open.items])
        await ann.close()
        await bob.close()
    await server_node.close()


if __name__ == "__main__":
    asyncio.run(main())
