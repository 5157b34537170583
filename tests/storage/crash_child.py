"""The process the crash tests kill: commits continuously through the Node API.

``python -m tests.storage.crash_child lmdb PATH`` or ``... postgres DSN SCHEMA``. Several
committers create and edit ``Counter`` entities; after each commit returns, the child
prints ``<entity id> <n>`` (the value just committed) and flushes, so every line the
parent reads is an acknowledged commit. It runs until it is killed.
"""

from __future__ import annotations

import asyncio
import sys

from mycelia import Model, Node
from mycelia.node import Context
from mycelia.proto import EntityId
from mycelia.storage import StorageEngine
from mycelia.storage.lmdb import LmdbStorage

WORKERS = 8


class Counter(Model, collection="counters"):
    worker: int
    n: int


async def committer(ctx: Context, worker: int) -> None:
    """Create an entity, edit it a few times, repeat; ack every commit on stdout."""
    entity: EntityId | None = None
    n = 0
    while True:
        n += 1
        async with ctx.transaction() as trx:
            if entity is None or n % 4 == 0:
                entity = trx.create(Counter, worker=worker, n=n).id
            else:
                (await trx.edit(Counter, entity)).n = n
        sys.stdout.write(f"{entity} {n}\n")
        sys.stdout.flush()


def open_storage(argv: list[str]) -> StorageEngine:
    if argv[0] == "lmdb":
        return LmdbStorage(argv[1])
    from mycelia.storage.postgres import PostgresStorage  # noqa: PLC0415 - optional driver

    return PostgresStorage(argv[1], schema=argv[2])


async def main(argv: list[str]) -> None:
    node = await Node.open(open_storage(argv), durable=True)
    await node.create_system()
    ctx = node.context()
    await asyncio.gather(*(committer(ctx, w) for w in range(WORKERS)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
