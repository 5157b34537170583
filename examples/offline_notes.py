"""An offline-first notes app on LMDB (run: python examples/offline_notes.py [DIR]).

The app's store lives on disk. It works with no server at all from its very first run:
it ships the system's root events (here read from the server; a real app bundles the
bytes) and joins the system with them. Notes written offline are owed to the server,
kept across restarts, and pushed when the server is reachable.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

import mycelia
from mycelia import Event, Model, Node, Text
from mycelia.storage import LmdbStorage, MemoryStorage


class Note(Model, collection="notes"):
    title: str
    body: Text = Text()


async def main(directory: Path) -> None:
    server_node = await Node.open(MemoryStorage(), durable=True)
    await server_node.create_system()
    shipped = [e.event.to_bytes() for e in await server_node.system_events()]  # bundle these

    # First run, offline: join the system from the shipped events, write two notes.
    async with Node.open(LmdbStorage(directory / "app"), durable=False) as app:
        await app.join_system([Event.from_bytes(blob) for blob in shipped])
        async with app.context().transaction() as trx:  # no server: returns once owed
            trx.create(Note, title="groceries", body="milk, eggs")
            trx.create(Note, title="ideas", body="an offline-first app")
        print("offline: owed to the server:", len(app.owed()))

    # A later run, online: the owed notes are pushed before the connection is READY.
    async with await mycelia.serve(server_node, host="127.0.0.1", port=0) as server:
        async with Node.open(LmdbStorage(directory / "app"), durable=False) as app:
            print("restarted: still owed:", len(app.owed()))
            await mycelia.connect(app, server.url)
            await app.wait_ready(timeout=10)
            print("online: owed now:", len(app.owed()))
    notes = await server_node.context().fetch(Note, "ORDER BY title")
    print("the server holds:", [n.title for n in notes])
    await server_node.close()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        asyncio.run(main(Path(sys.argv[1])))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            asyncio.run(main(Path(tmp)))
