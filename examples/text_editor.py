"""A collaborative text editor loop (run: python examples/text_editor.py).

Two clients type into the same document at once; each keystroke is a transaction with
``wait="local"`` (visible at once, pushed in the background), and a live query on each
side shows the other's edits. Text fields are CRDTs: concurrent inserts interleave and
both replicas end identical.
"""

from __future__ import annotations

import asyncio

import mycelia
from mycelia import EntityId, Model, Node, Text
from mycelia.storage import MemoryStorage


class Doc(Model, collection="docs"):
    name: str
    text: Text = Text()


async def type_into(node: Node, doc: EntityId, keys: str, *, at_end: bool) -> None:
    """Type ``keys`` one character per transaction, at the start or at the end."""
    for key in keys:
        async with node.context().transaction(wait="local") as trx:
            handle = await trx.edit(Doc, doc)
            handle.text.insert(len(handle.text) if at_end else 0, key)
        await asyncio.sleep(0)  # let the other editor's edits in between


async def settled(node: Node, doc: EntityId, length: int) -> str:
    """The document's text once this replica has ``length`` characters."""
    async with node.context().query(Doc, "name = ?", "notes") as live:
        changes = aiter(live)
        while len(live.items[0].text) < length:
            await asyncio.wait_for(anext(changes), 10)
        return str(live.items[0].text)


async def main() -> None:
    server_node = await Node.open(MemoryStorage(), durable=True)
    await server_node.create_system()
    async with await mycelia.serve(server_node, host="127.0.0.1", port=0) as server:
        editors = []
        for _ in range(2):
            node = await Node.open(MemoryStorage(), durable=False)
            await mycelia.connect(node, server.url)
            await node.wait_ready(timeout=10)
            editors.append(node)
        ann, bob = editors
        async with ann.context().transaction() as trx:
            doc = trx.create(Doc, name="notes", text="|").id
        await asyncio.gather(
            type_into(ann, doc, "hello", at_end=True), type_into(bob, doc, "world", at_end=False)
        )
        seen = await asyncio.gather(*(settled(node, doc, 11) for node in editors))
        print("ann sees:", seen[0])
        print("bob sees:", seen[1])
        print("identical:", seen[0] == seen[1])
        for node in editors:
            await node.close()
    await server_node.close()


if __name__ == "__main__":
    asyncio.run(main())
